"""Acceptance rules: pure functions, tensors in, (n_accepted, next_token) out.

No model call, no cache write; randomness only through the explicit generator passed in.
Letters follow Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding" (Algorithm 1): p is the target's distribution, q the draft's. K draft length,
V vocabulary."""

from __future__ import annotations

import torch


def accept_greedy(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy verification.

    draft: (K,) proposed tokens. target_logits: (K + 1, V), row i is the target's prediction
    after the i-th draft (row 0: after the last verified token).
    Returns the length n of the longest prefix of `draft` equal to the target's argmax and the
    target's own token after it, argmax(row n), so the output equals plain greedy decoding.
    """
    K = draft.shape[0]
    choice = target_logits.argmax(-1)  # (K + 1,)
    mismatch = (choice[:K] != draft).nonzero()
    n = int(mismatch[0, 0]) if mismatch.numel() else K
    return n, int(choice[n])


def accept_speculative(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

    draft: (K,) tokens, draft[i] ~ q[i]. q: (K, V) draft distributions. p: (K + 1, V) target
    distributions (after the same temperature / top-k / top-p as q).
    Draft i is accepted with probability min(1, p_i(x) / q_i(x)). At the first rejection the
    next token is drawn from norm(max(0, p_i - q_i)); if all K pass, from p_K. The output is then
    distributed exactly as p, whatever q is.
    Edge cases: q_i(x) = 0 (a draft the head could not have drawn, e.g. outside top-k) is
    treated as ratio +inf only if p_i(x) > 0 and as a rejection otherwise; a residual that is
    all zeros (p_i == q_i, reachable only through float rounding once x was rejected) falls back
    to p_i.
    """
    K = draft.shape[0]
    idx = torch.arange(K)
    px = p[idx, draft]  # (K,)
    qx = q[idx, draft]  # (K,)
    u = torch.rand(K, generator=generator, device=p.device, dtype=p.dtype)  # (K,)
    # accept iff u * q(x) < p(x): equals u < p/q for q > 0, accepts iff p > 0 for q = 0
    ok = (u * qx < px) & (px > 0)
    rejected = (~ok).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else K
    if n == K:
        dist = p[K]
    else:
        residual = (p[n] - q[n]).clamp_min(0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[n]
    nxt = torch.multinomial(dist, 1, generator=generator)
    return n, int(nxt)
