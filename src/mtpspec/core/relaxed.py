"""Relaxed acceptance rules: which drafts a round accepts beyond the exact rule. Pure functions,
tensors in, a (R,) bool mask out; no model call, no randomness.

Each judges a draft x (R,) against the target's law p (R, V) at the row it was drafted for: the
softmax of the logits when decoding greedily, the law after temperature / top-k / top-p when
sampling (the same p the exact rule uses). A relaxed round accepts a draft when the exact rule
does *or* the mask says so (`verify.accept`), so every rule accepts a superset of what `exact`
accepts; when a draft is rejected the target's own token follows, as under the exact rule.
The output is then no longer the target's own: the price is measured in `measure/quality.py`.

- typical (Medusa, Cai et al. 2024, "Medusa", section 2.3.1): p(x) > min(eps, delta * exp(-H(p))).
- topm: x among the target's m most likely tokens and p(x) >= alpha * max(p).
- entropy (entropy-gated, after FLy, "Training-free loosely speculative decoding", 2025): where
  the target is unsure, H(p) >= tau nats, x among its m most likely tokens.

Letters: R rows judged, V vocabulary, H(p) the entropy in nats."""

from __future__ import annotations

import torch

from ..config import AcceptanceConfig


def entropy(p: torch.Tensor) -> torch.Tensor:
    """(R, V) -> (R,) H(p) in nats (0 log 0 = 0)."""
    return torch.special.entr(p).sum(-1)  # -p log p elementwise, one pass


def rank(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(R,) tokens, (R, V) -> (R,) x's place in the target's ranking, 0 = the most likely. Ties go
    to the lower token id, as `argmax` breaks them, so rank 0 is the exact rule's own choice."""
    R = x.shape[0]
    px = p[torch.arange(R, device=p.device), x][:, None]  # (R, 1)
    ids = torch.arange(p.shape[1], device=p.device)[None]  # (1, V)
    ahead = (p > px) | ((p == px) & (ids < x[:, None]))  # (R, V)
    return ahead.sum(-1)


def among_top(x: torch.Tensor, p: torch.Tensor, m: int, top: torch.Tensor | None = None) -> torch.Tensor:
    """(R,) bool: rank(x) < m, without ranking the whole vocabulary: x is among the m most likely
    when p(x) beats the m-th largest probability; only a tie with it needs `rank`. `top`: p's
    m largest values per row (R, m), if the caller has them already."""
    R, V = p.shape
    if m <= 0 or m >= V:
        return torch.full((R,), m > 0, dtype=torch.bool, device=p.device)
    px = p[torch.arange(R, device=p.device), x]  # (R,)
    kth = (top if top is not None else p.topk(m, dim=-1).values)[:, m - 1]  # (R,) the m-th largest
    out = px > kth
    tie = px == kth
    if bool(tie.any()):
        out |= tie & (rank(x, p) < m)
    return out


def typical_passes(x: torch.Tensor, p: torch.Tensor, eps: float, delta: float) -> torch.Tensor:
    """Typical acceptance: p(x) > min(eps, delta * exp(-H(p))). A flat p (high entropy) lowers
    the bar; eps caps it, so a peaked p still accepts any x above eps. Larger eps or delta is
    stricter; eps = 1 with delta = inf (a bar of 1) passes nothing."""
    R = x.shape[0]
    px = p[torch.arange(R, device=p.device), x]  # (R,)
    bar = torch.clamp(delta * torch.exp(-entropy(p)), max=eps)  # (R,); inf * 0 cannot occur: exp(-H) > 0
    return px > bar


def topm_passes(x: torch.Tensor, p: torch.Tensor, m: int, alpha: float) -> torch.Tensor:
    """Top-m with a ratio: x among the target's m most likely tokens and p(x) >= alpha * max(p).
    Larger m or smaller alpha is looser; m = 0 passes nothing, m = 1 only the target's own
    choice (which greedy decoding accepts anyway). A token the
    target's law excludes (p(x) = 0, e.g. outside its top-k) never passes."""
    R = x.shape[0]
    px = p[torch.arange(R, device=p.device), x]  # (R,)
    top = p.topk(min(max(m, 1), p.shape[1]), dim=-1).values  # (R, m): the m-th largest and the largest, one pass
    return among_top(x, p, m, top) & (px >= alpha * top[:, 0]) & (px > 0)


def entropy_passes(x: torch.Tensor, p: torch.Tensor, tau: float, m: int) -> torch.Tensor:
    """Entropy-gated: only where the target is unsure (H(p) >= tau nats, several continuations
    plausible), a draft among its m most likely tokens. Smaller tau or larger m is looser;
    tau = inf or m = 0 passes nothing, m = 1 only the target's own choice."""
    px = p[torch.arange(x.shape[0], device=p.device), x]  # (R,)
    return (entropy(p) >= tau) & among_top(x, p, m) & (px > 0)


def relaxed_passes(x: torch.Tensor, p: torch.Tensor, rule: AcceptanceConfig) -> torch.Tensor:
    """(R,) drafts judged against (R, V) target laws -> (R,) bool: which the rule accepts
    (all False for `exact`: it adds nothing to the exact test)."""
    assert x.dim() == 1 and p.dim() == 2 and p.shape[0] == x.shape[0], (tuple(x.shape), tuple(p.shape))
    x = x.long().to(p.device)
    if rule.rule == "typical":
        return typical_passes(x, p, rule.eps, rule.delta)  # type: ignore[arg-type]
    if rule.rule == "topm":
        return topm_passes(x, p, rule.m, rule.alpha)  # type: ignore[arg-type]
    if rule.rule == "entropy":
        return entropy_passes(x, p, rule.tau, rule.m)  # type: ignore[arg-type]
    return torch.zeros_like(x, dtype=torch.bool)
