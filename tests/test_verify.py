"""The acceptance rules on their own, without a model.

Greedy: cases drawn by hand. Speculative sampling: the exact law of one round, enumerated over
every draft sequence from the very function `accept_speculative` draws with
(`speculative_probs`), equals the target's law; and `accept_speculative` itself, sampled with a
seeded generator, passes a chi-square test that an always-accept rule fails. Trees the same
way: the law of one round of `accept_speculative_tree` (from `speculative_tree_probs`),
enumerated over every way the walk can go and every draw of sampled drafts, equals the
target's, and the sampler passes a chi-square test that a rule without renormalisation fails.

K draft length, N tree drafts, V vocabulary, D tokens one tree round can emit. The chain's p
rows do not depend on the drafts (in the decoder they depend on the prefix), so the target's
law of K + 1 tokens is the product of the p rows; the tree tests use a toy target whose p
depends on the prefix, as a decoder's does.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import chisquare_pvalue, tree_probs_without_renormalisation

from mtpspec.core.sampling import multinomial
from mtpspec.core.tree import children, path_to
from mtpspec.core.verify import (
    accept_greedy,
    accept_speculative,
    accept_speculative_tree,
    point_masses,
    speculative_probs,
    speculative_tree_probs,
)


def _logits_choosing(choices: list[int], V: int = 5) -> torch.Tensor:
    """(len(choices), V) logits whose row i has its argmax at choices[i]."""
    logits = torch.randn(len(choices), V, generator=torch.Generator().manual_seed(len(choices)))
    logits[torch.arange(len(choices)), choices] = 10.0
    return logits


@pytest.mark.parametrize(
    "draft, target_choice, n, nxt",
    [
        ([2, 4, 1], [2, 4, 1, 3], 3, 3),  # all accepted: the bonus token comes from row K
        ([2, 4, 1], [0, 4, 1, 3], 0, 0),  # first draft wrong: nothing accepted, the target's token
        ([2, 4, 1], [2, 0, 1, 3], 1, 0),  # mismatch in the middle; later agreement does not count
        ([2, 4, 1], [2, 4, 0, 3], 2, 0),  # mismatch at the last draft
        ([], [3], 0, 3),  # k = 0: plain greedy decoding
    ],
)
def test_accept_greedy_hand_cases(draft, target_choice, n, nxt):
    assert accept_greedy(torch.tensor(draft, dtype=torch.long), _logits_choosing(target_choice)) == (n, nxt)


# -- speculative sampling: exact law by enumeration ---------------------------------------------


def _dirichlet(rows: int, V: int, seed: int, alpha: float = 0.7) -> torch.Tensor:
    g = np.random.default_rng(seed)
    return torch.tensor(g.dirichlet([alpha] * V, size=rows), dtype=torch.float32)


def _keep_top(probs: torch.Tensor, keep: int) -> torch.Tensor:
    """Zero all but the `keep` most likely tokens of each row and renormalise (a top-k q or p)."""
    kth = probs.topk(keep, dim=-1).values[:, -1:]
    out = probs.masked_fill(probs < kth, 0.0)
    return out / out.sum(-1, keepdim=True)


def round_law(q: torch.Tensor, p: torch.Tensor, probs=speculative_probs) -> np.ndarray:
    """Exact law, over V^(K+1) cells, of the first K + 1 tokens the decoder emits from one
    speculative round: drafts x ~ q (every sequence enumerated with its probability), the
    accepted prefix and the next token as `probs` says, and the positions the round did not
    reach filled from their own p row, as the following rounds would fill them."""
    K, V = q.shape
    p64 = p.double().numpy()
    law = np.zeros((V,) * (K + 1))
    for x in itertools.product(range(V), repeat=K):
        weight = float(np.prod([q[i, t].item() for i, t in enumerate(x)]))
        if weight == 0.0:
            continue  # a draft q cannot produce
        accept, next_dist = (a.double().numpy() for a in probs(torch.tensor(x, dtype=torch.long), q, p))
        reach = weight  # P(drafts x and drafts 0..n-1 all accepted)
        for n in range(K + 1):
            stop = 1.0 - accept[n] if n < K else 1.0  # draft n is the first rejected (or none is)
            tail = next_dist[n]  # token n, then fills for n + 1..K
            for j in range(n + 1, K + 1):
                tail = np.multiply.outer(tail, p64[j])
            law[x[:n]] += reach * stop * tail
            if n < K:
                reach *= accept[n]
    return law


def product_law(p: torch.Tensor) -> np.ndarray:
    law = np.ones(())
    for row in p.double().numpy():
        law = np.multiply.outer(law, row)
    return law


CASES = {
    # name: (q, p) builders from (K, V, seed)
    "random": lambda K, V, s: (_dirichlet(K, V, s), _dirichlet(K + 1, V, s + 100)),
    # the draft's top-k: q(x) = 0 where p(x) > 0
    "q_has_zeros": lambda K, V, s: (_keep_top(_dirichlet(K, V, s), 2), _dirichlet(K + 1, V, s + 100)),
    # the target's top-k: p(x) = 0 where q(x) > 0, so some drafts are rejected surely
    "p_has_zeros": lambda K, V, s: (_dirichlet(K, V, s), _keep_top(_dirichlet(K + 1, V, s + 100), 2)),
    # disjoint supports: every draft is rejected, every next token comes from the residual
    "disjoint": lambda K, V, s: (
        _keep_top(_dirichlet(K, V, s), 1),
        _dirichlet(K + 1, V, s + 100).index_fill(1, _dirichlet(K, V, s).argmax(-1).unique(), 0.0),
    ),
}


@pytest.mark.parametrize("K", [1, 2, 3])
@pytest.mark.parametrize("V", [4, 5])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_speculative_round_is_exactly_the_target_law(case, K, V, seed):
    q, p = CASES[case](K, V, seed)
    p = p / p.sum(-1, keepdim=True)
    law = round_law(q, p)
    np.testing.assert_allclose(law.sum(), 1.0, atol=1e-6)
    # The first emitted token alone, then all K + 1 positions jointly.
    np.testing.assert_allclose(law.reshape(V, -1).sum(-1), p[0].double().numpy(), atol=1e-6)
    np.testing.assert_allclose(law, product_law(p), atol=1e-6)


def test_equal_p_and_q_accepts_every_draft():
    q = _dirichlet(3, 5, 7)
    p = torch.cat([q, _dirichlet(1, 5, 8)])
    for x in itertools.product(range(5), repeat=3):
        accept, _ = speculative_probs(torch.tensor(x), q, p)
        assert torch.equal(accept, torch.ones(3))
    np.testing.assert_allclose(round_law(q, p), product_law(p), atol=1e-6)


def test_all_zero_residual_falls_back_to_p():
    """p == q leaves max(0, p - q) all zeros: the next token is then drawn from p, not NaN."""
    q = _dirichlet(2, 5, 3)
    p = torch.cat([q, _dirichlet(1, 5, 4)])
    _, next_dist = speculative_probs(torch.tensor([0, 1]), q, p)
    assert torch.equal(next_dist, p)


def test_draft_outside_q_support():
    """A draft q could not have drawn (e.g. outside the head's top-k): kept surely where the
    target allows it, rejected surely where it does not."""
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    p = torch.tensor([[0.1, 0.1, 0.8, 0.0], [0.25, 0.25, 0.25, 0.25]])
    accept_in, _ = speculative_probs(torch.tensor([2]), q, p)
    accept_out, next_dist = speculative_probs(torch.tensor([3]), q, p)
    assert accept_in.tolist() == [1.0] and accept_out.tolist() == [0.0]
    g = torch.Generator().manual_seed(0)
    assert all(accept_speculative(torch.tensor([2]), q, p, g)[0] == 1 for _ in range(50))
    results = [accept_speculative(torch.tensor([3]), q, p, g) for _ in range(50)]
    assert all(n == 0 and tok == 2 for n, tok in results)  # residual max(0, p - q) is one-hot on 2
    assert next_dist[0].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_enumeration_detects_a_wrong_rule():
    """The exact check has power: accepting every draft gives the draft's law, not p's."""

    def always_accept(draft, q, p):
        accept, next_dist = speculative_probs(draft, q, p)
        return torch.ones_like(accept), next_dist

    q, p = CASES["random"](2, 4, 0)
    assert np.abs(round_law(q, p, always_accept) - product_law(p)).max() > 1e-2


# -- speculative sampling: the real sampler, Monte Carlo -----------------------------------------


def _always_accept(draft, q, p, generator):
    """A biased rule: every draft passes, then a token from p_K."""
    return draft.shape[0], int(torch.multinomial(p[-1], 1, generator=generator))


def _first_two_tokens(rule, q: torch.Tensor, p: torch.Tensor, n: int, seed: int) -> np.ndarray:
    """Counts over V x V of the first two tokens emitted by `rule` in n seeded rounds; when a
    round emits one token, the second is drawn from p[1], as the next round would."""
    K, V = q.shape
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, n, replacement=True, generator=g).T  # (n, K), row r ~ q
    counts = np.zeros((V, V))
    for draft in drafts:
        n_acc, nxt = rule(draft, q, p, g)
        emitted = draft[:n_acc].tolist() + [nxt]
        if len(emitted) == 1:
            emitted.append(int(torch.multinomial(p[1], 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
    return counts


@pytest.mark.parametrize("rule, passes", [(accept_speculative, True), (_always_accept, False)])
@pytest.mark.slow
def test_sampled_rounds_match_the_target_law(rule, passes):
    q = _dirichlet(2, 5, 11)
    p = _dirichlet(3, 5, 12)
    counts = _first_two_tokens(rule, q, p, n=20_000, seed=0)
    pvalue = chisquare_pvalue(counts, np.outer(p[0].double(), p[1].double()))
    if passes:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


# -- multi-draft speculative sampling on trees ---------------------------------------------------

#          root(0)
#        /    |    \
#    d0(1)  d1(2)  d2(3)
#    /  \     |
# d3(4) d4(5) d5(6)
TREE = [-1, -1, -1, 0, 0, 1]
D = 3  # a round emits at most two drafts + the target's own token


class ToyTarget:
    """A target over V tokens whose next-token law depends on the whole prefix (a fixed
    Dirichlet draw per prefix), so two tree nodes with the same path share their p row, as in a
    decoder. `keep` > 0 zeroes all but the `keep` likeliest tokens of each row (a top-k p)."""

    def __init__(self, V: int, seed: int, keep: int = 0):
        self.V, self.seed, self.keep = V, seed, keep
        self.memo: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in self.memo:
            row = np.random.default_rng([self.seed, len(prefix), *prefix]).dirichlet([0.7] * self.V)
            if self.keep:
                row = np.where(row >= np.sort(row)[-self.keep], row, 0.0)
            self.memo[prefix] = row / row.sum()
        return self.memo[prefix]

    def law(self, length: int) -> np.ndarray:
        """(V,) * length: the exact law of the next `length` tokens."""
        out = np.zeros((self.V,) * length)
        for seq in itertools.product(range(self.V), repeat=length):
            out[seq] = np.prod([self(seq[:j])[t] for j, t in enumerate(seq)])
        return out

    def rows(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """(M, V) p at every verify row: the law after the row's path of tokens."""
        paths = [tuple(tokens[r - 1] for r in path_to(parents, row)[1:]) for row in range(len(parents) + 1)]
        return torch.tensor(np.stack([self(path) for path in paths]), dtype=torch.float32)


def tree_round_law(tokens: list[int], parents: list[int], q: torch.Tensor, target: ToyTarget,
                   probs=speculative_tree_probs) -> np.ndarray:
    """Exact law over V^D of the first D tokens emitted from one tree round with these drafts:
    every way the walk can go, weighted by `probs`' pass probabilities, then the target's own
    token from the residual where the walk stops, and the positions the round did not reach
    filled from the target, as the following rounds would fill them."""
    V = target.V
    accept, next_dist = (a.double().numpy() for a in probs(torch.tensor(tokens), parents, q, target.rows(tokens, parents)))
    kids = children(parents)
    law = np.zeros((V,) * D)

    def fill(prefix: tuple[int, ...], weight: float) -> None:
        if len(prefix) == D:
            law[prefix] += weight
            return
        for t, pt in enumerate(target(prefix)):
            if pt:
                fill(prefix + (t,), weight * pt)

    def walk(row: int, prefix: tuple[int, ...], reach: float) -> None:
        for c in kids[row]:  # child c passes after all earlier siblings failed
            walk(c, prefix + (tokens[c - 1],), reach * accept[c - 1])
            reach *= 1.0 - accept[c - 1]
        for t, pt in enumerate(next_dist[row]):  # every child failed: the target's own token
            if pt:
                fill(prefix + (t,), reach * pt)

    walk(0, (), 1.0)
    return law


def sampled_tree_law(q: torch.Tensor, parents: list[int], target: ToyTarget, probs=speculative_tree_probs) -> np.ndarray:
    """The same law when draft i is drawn from q[i]: every draw enumerated with its weight (a
    one-hot q row is a deterministic draft: one draw, weight 1)."""
    law = np.zeros((target.V,) * D)
    support = [row.nonzero().flatten().tolist() for row in q]
    for x in itertools.product(*support):
        weight = float(np.prod([q[i, t].item() for i, t in enumerate(x)]))
        law += weight * tree_round_law(list(x), parents, q, target, probs)
    return law


def _top_children(parents: list[int], V: int, seed: int, dup: bool = False) -> list[int]:
    """Deterministic drafts as a top-w tree proposes them: under each row, distinct tokens in
    the order of a random draft ranking; `dup` makes the last sibling repeat the first (as two
    branches of a merged tree can)."""
    g = np.random.default_rng(seed)
    tokens = [0] * len(parents)
    for kids in children(parents):
        ranking = g.permutation(V).tolist()
        for j, c in enumerate(kids):
            tokens[c - 1] = ranking[0] if dup and j == len(kids) - 1 and j > 0 else ranking[j]
    return tokens


def _sibling_q(parents: list[int], V: int, seed: int, keep: int = 0) -> torch.Tensor:
    """(N, V) one draft law per row, shared by all its children: siblings drawn i.i.d. from it."""
    rows = _dirichlet(len(parents) + 1, V, seed)
    if keep:
        rows = _keep_top(rows, keep)
    return rows[[p + 1 for p in parents]]


TREE_CASES = {
    # name: (parents, V, seed) -> (q, target)
    # deterministic top-w children: verified as point masses
    "top_w": lambda P, V, s: (point_masses(torch.tensor(_top_children(P, V, s)), V), ToyTarget(V, s)),
    # a sibling repeating its first sibling's token: rejected surely once that one failed
    "duplicate_siblings": lambda P, V, s: (point_masses(torch.tensor(_top_children(P, V, s, dup=True)), V),
                                           ToyTarget(V, s)),
    # the target's top-2: some deterministic drafts lie outside p's support
    "top_w_p_has_zeros": lambda P, V, s: (point_masses(torch.tensor(_top_children(P, V, s)), V),
                                          ToyTarget(V, s, keep=2)),
    # every draft drawn from its own q
    "sampled": lambda P, V, s: (_dirichlet(len(P), V, s + 50), ToyTarget(V, s)),
    # siblings drawn i.i.d. from one q per parent (SpecInfer's multi-step sampling), with ties
    "sampled_iid_siblings": lambda P, V, s: (_sibling_q(P, V, s + 50), ToyTarget(V, s)),
    # the draft's top-2: q(x) = 0 where p(x) > 0
    "sampled_q_has_zeros": lambda P, V, s: (_sibling_q(P, V, s + 50, keep=2), ToyTarget(V, s)),
    # a lookup branch (deterministic) under the root beside sampled children
    "mixed": lambda P, V, s: (
        torch.cat([point_masses(torch.tensor([s % V]), V), _dirichlet(len(P) - 1, V, s + 50)]),
        ToyTarget(V, s),
    ),
}


@pytest.mark.parametrize("case", list(TREE_CASES))
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])  # a second draw of p and q: 2 s a case
def test_tree_round_is_exactly_the_target_law(case, seed):
    V = 4
    q, target = TREE_CASES[case](TREE, V, seed)
    law = sampled_tree_law(q, TREE, target)
    want = target.law(D)
    np.testing.assert_allclose(law.sum(), 1.0, atol=1e-6)
    np.testing.assert_allclose(law.sum((1, 2)), target(()), atol=1e-6)  # the first token
    np.testing.assert_allclose(law.sum(2), want.sum(2), atol=1e-6)  # the first two
    np.testing.assert_allclose(law, want, atol=1e-6)  # all three


def test_tree_enumeration_detects_a_rule_without_renormalisation():
    q, target = TREE_CASES["top_w"](TREE, 4, 0)
    assert np.abs(sampled_tree_law(q, TREE, target, tree_probs_without_renormalisation) - target.law(D)).max() > 1e-2


def test_tree_rule_on_a_chain_is_the_chain_rule():
    q = _dirichlet(3, 5, 21)
    p = _dirichlet(4, 5, 22)
    draft = torch.tensor([1, 4, 2])
    accept, next_dist = speculative_tree_probs(draft, [-1, 0, 1], q, p)
    want_accept, want_next = speculative_probs(draft, q, p)
    torch.testing.assert_close(accept, want_accept, rtol=0, atol=0)
    torch.testing.assert_close(next_dist, want_next, rtol=0, atol=0)


def test_tree_sampling_hand_cases():
    V = 4
    tokens = torch.tensor([2, 1, 2, 0, 3, 3])  # d0 and d2 both propose 2
    q = point_masses(tokens, V)
    p = torch.full((7, V), 0.25)
    p[0] = torch.tensor([0.2, 0.3, 0.5, 0.0])
    accept, next_dist = speculative_tree_probs(tokens, TREE, q, p)
    # d0 passes with p(2) = 0.5; then the residual is [0.4, 0.6, 0, 0]: d1 passes with 0.6;
    # then [1, 0, 0, 0]: d2 repeats the rejected 2 and never passes, and the target's own
    # token after three failures is 0.
    torch.testing.assert_close(accept[:3], torch.tensor([0.5, 0.6, 0.0]))
    torch.testing.assert_close(next_dist[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # leaves keep their p; d3, d4 are tested against d0's row
    torch.testing.assert_close(next_dist[4:], p[4:])
    torch.testing.assert_close(accept[3:5], torch.tensor([0.25, 1 / 3]))
    # a target certain of each next token: the walk is fixed, as in greedy verification
    one_hot = torch.zeros(7, V)
    one_hot[0, 1] = one_hot[2, 3] = one_hot[6, 0] = 1.0
    g = torch.Generator().manual_seed(0)
    assert all(accept_speculative_tree(tokens, TREE, q, one_hot, g) == ([0, 2, 6], 0) for _ in range(20))


def _walk_with(probs):
    """A sampler that walks the tree as `accept_speculative_tree` does, with other pass
    probabilities (for a negative control)."""

    def rule(tokens, parents, q, p, generator):
        accept, next_dist = probs(tokens, parents, q, p)
        kids, path = children(parents), [0]
        while True:
            for c in kids[path[-1]]:
                if float(torch.rand((), generator=generator)) < float(accept[c - 1]):
                    path.append(c)
                    break
            else:
                return path, int(torch.multinomial(next_dist[path[-1]], 1, generator=generator))

    return rule


@pytest.mark.parametrize("rule, case, passes", [
    (accept_speculative_tree, "top_w", True),
    (accept_speculative_tree, "sampled_iid_siblings", True),
    (_walk_with(tree_probs_without_renormalisation), "top_w", False),
])
@pytest.mark.slow
def test_sampled_tree_rounds_match_the_target_law(rule, case, passes):
    """The real sampler: counts of the first two emitted tokens over many seeded rounds (drafts
    drawn afresh from q each round) against the target's joint law."""
    V, n = 4, 10_000
    q, target = TREE_CASES[case](TREE, V, 3)
    g = torch.Generator().manual_seed(0)
    counts = np.zeros((V, V))
    for _ in range(n):
        tokens = torch.multinomial(q, 1, generator=g).flatten()  # (N,), fixed where q is one-hot
        path, nxt = rule(tokens, TREE, q, target.rows(tokens.tolist(), TREE), g)
        emitted = [int(tokens[r - 1]) for r in path[1:]] + [nxt]
        if len(emitted) == 1:  # the next round's first token
            emitted.append(int(torch.multinomial(torch.tensor(target((emitted[0],))), 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
    pvalue = chisquare_pvalue(counts, target.law(2))
    if passes:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


def test_a_round_without_drafts_draws_what_the_general_rule_draws():
    """K = 0 (a sampled request with no drafts this round): the token and the generator's state
    after it equal the general rule's, whose law for no drafts is p_0 (and which draws no uniform)."""
    g = torch.Generator().manual_seed(0)
    for seed in range(20):
        p = torch.rand(1, 300, generator=g) ** 8
        p = p / p.sum(-1, keepdim=True)
        empty = torch.empty(0, dtype=torch.long)
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        n, tok = accept_speculative(empty, torch.empty(0, 300), p, ours)
        _, next_dist = speculative_probs(empty, torch.empty(0, 300), p)
        torch.rand(0, generator=theirs)
        assert (n, tok) == (0, int(multinomial(next_dist[0], theirs)))
        assert torch.equal(ours.get_state(), theirs.get_state())
