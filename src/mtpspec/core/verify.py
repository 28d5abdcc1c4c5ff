"""Acceptance rules: pure functions, tensors in, (n_accepted, next_token) out.

No model call, no cache write; randomness only through the explicit generator passed in.
Letters follow Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding" (Algorithm 1): p is the target's distribution, q the draft's. Trees are verified by
multi-draft speculative sampling (recursive rejection sampling over siblings: Miao et al. 2024,
"SpecInfer", Algorithm 2; Sun et al. 2023, "SpecTr"). K draft length, N tree drafts, M = N + 1
verify rows (root first), V vocabulary.

Every rule takes an optional `passes` mask (N,) from `relaxed.py`: drafts a relaxed rule accepts
whatever the exact test says. None (the default, and always under `exact`) is the exact rule."""

from __future__ import annotations

import torch

from ..config import AcceptanceConfig, SamplingConfig
from .draft import Draft
from .relaxed import relaxed_passes
from .sampling import multinomial, probs_from_logits
from .tree import children


def accept_greedy(draft: torch.Tensor, target_logits: torch.Tensor,
                  passes: torch.Tensor | None = None, choice: torch.Tensor | None = None) -> tuple[int, int]:
    """Greedy verification.

    draft: (K,) proposed tokens. target_logits: (K + 1, V), row i is the target's prediction
    after the i-th draft (row 0: after the last verified token).
    Returns the length n of the longest prefix of `draft` equal to the target's argmax and the
    target's own token after it, argmax(row n), so the output equals plain greedy decoding.
    `passes` (K,): drafts a relaxed rule accepts too (the prefix then need not equal the argmax).
    `choice` (K + 1,): the rows' argmax if the forward already found it.
    """
    K = draft.shape[0]
    choice = target_logits.argmax(-1) if choice is None else choice  # (K + 1,)
    miss = choice[:K] != draft  # (K,)
    if passes is not None:
        miss &= ~passes
    mismatch = miss.nonzero()
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
    accept, residual = _test_and_residual(draft, q, p[:K])  # (K,), (K, V)
    return accept, torch.cat([residual, p[K:]], dim=0)


def _test_and_residual(x: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One rejection test per row: x (R,) drawn from q (R, V), judged against p (R, V).
    Returns the probability min(1, p(x) / q(x)) that x passes (R,) and the law to draw from
    when it fails, norm(max(0, p - q)) (R, V); edge cases as in `speculative_probs`."""
    R = x.shape[0]
    idx = torch.arange(R, device=x.device)
    px = p[idx, x]  # (R,)
    qx = q[idx, x]  # (R,)
    accept = torch.where(qx > 0, px / qx, (px > 0).to(p.dtype)).clamp(max=1.0)  # (R,)
    residual = (p - q).clamp_min(0)  # (R, V)
    total = residual.sum(-1, keepdim=True)  # (R, 1)
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p)
    return accept, residual


def point_masses(tokens: torch.Tensor, V: int) -> torch.Tensor:
    """(N,) -> (N, V) one-hot rows: the q of drafts proposed deterministically (the head's
    top-w tree children, a prompt-lookup branch, a drafter that reports no q).

    Against a point mass the test above passes x with probability p(x) and, on failure, draws
    from p with x removed, so the emitted token is x with probability p(x) and any y != x with
    probability (1 - p(x)) * p(y) / (1 - p(x)) = p(y): exact whatever chose x, only less
    often accepted than against the law x was really drawn from."""
    return torch.nn.functional.one_hot(tokens.long(), V).float()  # (N, V)


def accept_speculative(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None,
    passes: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

    draft: (K,) tokens, draft[i] ~ q[i]. q: (K, V) draft distributions. p: (K + 1, V) target
    distributions (after the same temperature / top-k / top-p as q).
    Draft i is accepted with probability min(1, p_i(x) / q_i(x)). At the first rejection the
    next token is drawn from norm(max(0, p_i - q_i)); if all K pass, from p_K. The output is then
    distributed exactly as p, whatever q is. The probabilities come from `speculative_probs`
    (edge cases documented there); this function only draws. `passes` (K,): drafts a relaxed
    rule accepts surely (the same uniforms are drawn, so with none passing this is the exact rule,
    draw for draw).
    """
    K = draft.shape[0]
    if K == 0:  # nothing to test: the draw from p_0, as below (no uniform is drawn for no drafts)
        return 0, int(multinomial(p[0], generator))
    accept, next_dist = speculative_probs(draft, q, p)  # (K,), (K + 1, V)
    if passes is not None:
        accept = torch.where(passes, torch.ones_like(accept), accept)
    u = torch.rand(K, generator=generator, device=p.device, dtype=p.dtype)  # (K,)
    rejected = (u >= accept).nonzero()  # u in [0, 1): P(u < a) = a
    n = int(rejected[0, 0]) if rejected.numel() else K
    nxt = multinomial(next_dist[n], generator)
    return n, int(nxt)


def accept_greedy_tree(tokens: torch.Tensor, parents: list[int], target_logits: torch.Tensor,
                       passes: torch.Tensor | None = None, choice: torch.Tensor | None = None) -> tuple[list[int], int]:
    """Greedy verification of a draft tree: from the root, follow the child whose token is the
    target's argmax, as long as there is one. target_logits: (M, V), row 0 the root, row i + 1
    draft i. Returns the verify rows of the accepted path (root first) and the target's own
    token after its last row; the output equals plain greedy decoding. `passes` (N,): drafts a
    relaxed rule accepts too; where no child is the argmax, the walk takes the first that passes."""
    choice = (target_logits.argmax(-1) if choice is None else choice).tolist()  # (M,)
    toks = tokens.tolist()
    ok = passes.tolist() if passes is not None else [False] * len(toks)
    kids = children(parents)
    path = [0]
    while True:
        nxt = next((c for c in kids[path[-1]] if toks[c - 1] == choice[path[-1]]), None)
        if nxt is None:
            nxt = next((c for c in kids[path[-1]] if ok[c - 1]), None)
        if nxt is None:
            return path, int(choice[path[-1]])
        path.append(nxt)


def speculative_tree_probs(
    tokens: torch.Tensor, parents: list[int], q: torch.Tensor, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact law of one round of multi-draft speculative sampling on a tree, without
    drawing anything (SpecInfer, Algorithm 2: recursive rejection sampling over siblings).

    tokens: (N,) drafts, parents as in `tree.py`, q: (N, V) the law each draft was drawn from
    given the drafts before it (`point_masses` for deterministic ones), p: (M, V) the target's
    law at every verify row (row 0 the root, row i + 1 after draft i).
    At a row the children are tried in draft order against a residual r that starts as the
    row's p: child c passes with probability min(1, r(x_c) / q_c(x_c)); when it fails
    r <- norm(max(0, r - q_c)) (for a point mass: r with x_c zeroed, renormalised), so a
    sibling repeating a rejected token is rejected surely. Each step keeps the law of what the
    row emits equal to r, hence to p: the token of the child that passes, or one drawn from
    the last residual.
    Returns `accept` (N,): the probability that draft i passes once its parent is reached and
    its earlier siblings failed; `next_dist` (M, V): the law of the target's own token when the
    walk stops at a row, the residual after all its children failed (p for a leaf).
    """
    N = tokens.shape[0]
    accept = p.new_zeros(N)  # (N,)
    next_dist = p.clone()  # (M, V)
    for row, kids in enumerate(children(parents)):
        r = p[row:row + 1]  # (1, V)
        for c in kids:
            a, r = _test_and_residual(tokens[c - 1:c], q[c - 1:c], r)  # (1,), (1, V)
            accept[c - 1] = a[0]
        next_dist[row] = r[0]
    return accept, next_dist


def accept_speculative_tree(
    tokens: torch.Tensor, parents: list[int], q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None,
    passes: torch.Tensor | None = None,
) -> tuple[list[int], int]:
    """Multi-draft speculative sampling on a tree: the output is distributed exactly as p.

    tokens, parents, q, p as in `speculative_tree_probs`, which gives the probabilities; this
    function only draws. From the root, each child in turn passes with its probability (one
    uniform each); on a pass the walk moves to that child, and when every child of the current
    row failed (or it has none) the target's own token is drawn from that row's residual.
    Returns the verify rows of the accepted path (root first) and that token, as
    `accept_greedy_tree` does. `passes` (N,): drafts a relaxed rule accepts surely once reached."""
    accept, next_dist = speculative_tree_probs(tokens, parents, q, p)  # (N,), (M, V)
    if passes is not None:
        accept = torch.where(passes, torch.ones_like(accept), accept)
    pass_prob = accept.tolist()
    kids = children(parents)
    path = [0]
    while True:
        for c in kids[path[-1]]:
            u = float(torch.rand((), generator=generator, device=p.device, dtype=p.dtype))  # [0, 1)
            if u < pass_prob[c - 1]:
                path.append(c)
                break
        else:
            nxt = multinomial(next_dist[path[-1]], generator)
            return path, int(nxt)


def accept(draft: Draft, target_logits: torch.Tensor, sampling: SamplingConfig,
           generator: torch.Generator | None, acceptance: AcceptanceConfig | None = None,
           p: torch.Tensor | None = None, choice: torch.Tensor | None = None) -> tuple[list[int], int]:
    """The acceptance rule for this draft and sampling setting: greedy or speculative sampling,
    chain or tree. target_logits: (N + 1, V), row 0 after the last committed token, row i + 1
    after draft i. Returns the verify rows kept (root first: the accepted drafts are rows
    1..len - 1) and the next token, the target's own. When sampling, a draft without q was
    proposed deterministically and is verified against point masses. `acceptance`: None or
    `exact` is the exact rule; a relaxed one also accepts the drafts `relaxed_passes` names,
    each judged against the target's law at its parent's row (softmax of the logits when greedy).
    `p` (N + 1, V): the target's law already computed from these logits (`probs_from_logits`,
    e.g. for many requests' rows at once), else it is computed here. `choice` (N + 1,): the
    rows' argmax, if the forward found it (greedy)."""
    relaxed = acceptance is not None and not acceptance.exact
    if sampling.greedy:
        passes = _greedy_passes(draft, target_logits, acceptance) if relaxed else None  # type: ignore[arg-type]
        if not draft.is_chain:
            return accept_greedy_tree(draft.tokens, draft.parent_list(), target_logits, passes, choice)
        n, nxt = accept_greedy(draft.tokens, target_logits, passes, choice)
        return list(range(n + 1)), nxt
    if p is None:
        p = probs_from_logits(target_logits, sampling)  # (N + 1, V)
    q = draft.q.to(p) if draft.q is not None else point_masses(draft.tokens, p.shape[1]).to(p)  # (N, V)
    passes = relaxed_passes(draft.tokens, p[_judged_rows(draft)], acceptance) if relaxed else None  # type: ignore[arg-type]
    if not draft.is_chain:
        return accept_speculative_tree(draft.tokens, draft.parent_list(), q, p, generator, passes)
    n, nxt = accept_speculative(draft.tokens, q, p, generator, passes)
    return list(range(n + 1)), nxt


def _judged_rows(draft: Draft) -> torch.Tensor:
    """(N,) the verify row each draft is judged at: its parent's (row 0 is the root)."""
    return torch.tensor([i + 1 for i in draft.parent_list()], dtype=torch.long)


def _greedy_passes(draft: Draft, target_logits: torch.Tensor, acceptance: AcceptanceConfig) -> torch.Tensor:
    """(N,) bool: the drafts a relaxed rule accepts under greedy decoding, judged against the
    softmax of the target's logits at their parent's row. Only the drafts the exact rule rejects
    are judged: the others pass anyway."""
    row = _judged_rows(draft).to(target_logits.device)
    tokens = draft.tokens.to(row.device)
    miss = (tokens != target_logits.argmax(-1)[row]).nonzero()[:, 0]  # (n,)
    passes = torch.zeros(len(row), dtype=torch.bool, device=row.device)
    passes[miss] = relaxed_passes(tokens[miss], target_logits[row[miss]].float().softmax(-1), acceptance)
    return passes
