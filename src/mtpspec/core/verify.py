"""Acceptance rules: pure functions, tensors in, (n_accepted, next_token) out.

No model call, no cache write; randomness only through the explicit generator passed in.
Letters follow Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding" (Algorithm 1): p is the target's distribution, q the draft's. K draft length,
V vocabulary."""

from __future__ import annotations

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .draft import Draft
from .sampling import probs_from_logits
from .tree import children


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


def speculative_probs(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact law of one speculative-sampling round, without drawing anything.

    draft: (K,) tokens, q: (K, V), p: (K + 1, V) as in `accept_speculative`.
    Returns `accept` (K,): the probability min(1, p_i(x_i) / q_i(x_i)) that draft i passes,
    and `next_dist` (K + 1, V): row i < K is the distribution of the next token when draft i is
    the first rejected, norm(max(0, p_i - q_i)); row K is p_K, used when all K pass.
    Edge cases: q_i(x) = 0 (a draft the head could not have drawn, e.g. outside top-k) passes
    surely if p_i(x) > 0 and never otherwise; a residual that is all zeros (p_i == q_i,
    reachable only through float rounding once x was rejected) falls back to p_i.
    """
    K = draft.shape[0]
    idx = torch.arange(K, device=draft.device)
    px = p[idx, draft]  # (K,)
    qx = q[idx, draft]  # (K,)
    accept = torch.where(qx > 0, px / qx, (px > 0).to(p.dtype)).clamp(max=1.0)  # (K,)
    residual = (p[:K] - q).clamp_min(0)  # (K, V)
    total = residual.sum(-1, keepdim=True)  # (K, 1)
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p[:K])
    return accept, torch.cat([residual, p[K:]], dim=0)


def accept_speculative(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

    draft: (K,) tokens, draft[i] ~ q[i]. q: (K, V) draft distributions. p: (K + 1, V) target
    distributions (after the same temperature / top-k / top-p as q).
    Draft i is accepted with probability min(1, p_i(x) / q_i(x)). At the first rejection the
    next token is drawn from norm(max(0, p_i - q_i)); if all K pass, from p_K. The output is then
    distributed exactly as p, whatever q is. The probabilities come from `speculative_probs`
    (edge cases documented there); this function only draws.
    """
    K = draft.shape[0]
    accept, next_dist = speculative_probs(draft, q, p)  # (K,), (K + 1, V)
    u = torch.rand(K, generator=generator, device=p.device, dtype=p.dtype)  # (K,)
    rejected = (u >= accept).nonzero()  # u in [0, 1): P(u < a) = a
    n = int(rejected[0, 0]) if rejected.numel() else K
    nxt = torch.multinomial(next_dist[n], 1, generator=generator)
    return n, int(nxt)


def accept_greedy_tree(tokens: torch.Tensor, parents: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification of a draft tree: from the root, follow the child whose token is the
    target's argmax, as long as there is one. target_logits: (M, V), row 0 the root, row i + 1
    draft i. Returns the verify rows of the accepted path (root first) and the target's own
    token after its last row; the output equals plain greedy decoding."""
    choice = target_logits.argmax(-1).tolist()  # (M,)
    toks = tokens.tolist()
    kids = children(parents)
    path = [0]
    while True:
        nxt = next((c for c in kids[path[-1]] if toks[c - 1] == choice[path[-1]]), None)
        if nxt is None:
            return path, int(choice[path[-1]])
        path.append(nxt)


def accept(draft: Draft, target_logits: torch.Tensor, sampling: SamplingConfig,
           generator: torch.Generator | None) -> tuple[list[int], int]:
    """The acceptance rule for this draft and sampling setting: greedy or speculative sampling,
    chain or tree. target_logits: (N + 1, V), row 0 after the last committed token, row i + 1
    after draft i. Returns the verify rows kept (root first: the accepted drafts are rows
    1..len - 1) and the next token, the target's own."""
    N = draft.tokens.shape[0]
    if not draft.is_chain:
        if not sampling.greedy:
            raise InputError("Sampling with a draft tree is not supported; draft a chain or decode greedily.")
        return accept_greedy_tree(draft.tokens, draft.parent_list(), target_logits)
    if sampling.greedy:
        n, nxt = accept_greedy(draft.tokens, target_logits)
    else:
        p = probs_from_logits(target_logits, sampling)  # (N + 1, V)
        if N and draft.q is None:
            raise InputError("The drafter returned no q: sampling needs the draft distribution.")
        q = draft.q.to(p) if draft.q is not None else p.new_zeros(0, p.shape[1])
        n, nxt = accept_speculative(draft.tokens, q, p, generator)
    return list(range(n + 1)), nxt
