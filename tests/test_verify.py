"""The acceptance rules on their own, without a model.

Greedy: cases drawn by hand. Speculative sampling: the exact law of one round, enumerated over
every draft sequence from the very function `accept_speculative` draws with
(`speculative_probs`), equals the target's law; and `accept_speculative` itself, sampled with a
seeded generator, passes a chi-square test that an always-accept rule fails.

K draft length, V vocabulary. The p rows here do not depend on the drafts (in the decoder they
depend on the prefix), so the target's law of K + 1 tokens is the product of the p rows.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import chisquare_pvalue

from mtpspec.core.verify import accept_greedy, accept_speculative, speculative_probs


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
def test_sampled_rounds_match_the_target_law(rule, passes):
    q = _dirichlet(2, 5, 11)
    p = _dirichlet(3, 5, 12)
    counts = _first_two_tokens(rule, q, p, n=20_000, seed=0)
    pvalue = chisquare_pvalue(counts, np.outer(p[0].double(), p[1].double()))
    if passes:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6
