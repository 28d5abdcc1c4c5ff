"""Relaxed acceptance: opt-in, a superset of exact, and exact at its limit.

- The rules as pure functions: hand cases; each is monotone in its parameter (a looser value
  passes a superset); at its limiting parameter a rule passes nothing but the target's own
  choice; a token the target's law excludes never passes.
- The rounds: a relaxed verify accepts at least what the exact one accepts; with nothing passing
  it is the exact rule, draw for draw.
- Decoding: exact is the default and says so; at the limiting parameter every rule's output
  equals exact output, token for token (greedy: chains, trees, switch; sampling with a seed);
  a loose rule gets more tokens per forward, every drafted token it kept passes the rule against
  the target's own logits, and every other token is the target's own argmax.
- Bad parameters are an InputError that names the parameter.

R rows, V vocabulary, K draft length."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import OracleDrafter, hf_greedy, tiny_model

import mtpspec
from mtpspec import AcceptanceConfig
from mtpspec.core.drafters import SwitchDrafter, TreeConfig, TreeDrafter
from mtpspec.core.relaxed import among_top, entropy, entropy_passes, rank, relaxed_passes, topm_passes, typical_passes
from mtpspec.core.verify import accept_greedy, accept_greedy_tree, accept_speculative, accept_speculative_tree

# Each rule at its limiting parameter: nothing passes (exact, greedy or sampling) ...
LIMITS = ["typical:1,inf", "topm:0", "entropy:inf,5", "entropy:0,0"]
# ... or only the target's own choice, which greedy decoding accepts anyway (sampling does not always).
GREEDY_LIMITS = [*LIMITS, "topm:1,0", "entropy:0,1"]
# Each rule loosened step by step: every setting passes a superset of the one before it.
SWEEPS = {
    "typical eps (delta = sqrt(eps))": ["typical:1", "typical:0.3", "typical:0.09", "typical:0.01"],
    "typical delta": ["typical:0.2,2", "typical:0.2,1", "typical:0.2,0.3", "typical:0.2,0"],
    "topm alpha": ["topm:3,1", "topm:3,0.5", "topm:3,0.2", "topm:3,0"],
    "topm m": ["topm:1,0.1", "topm:2,0.1", "topm:4,0.1", "topm:50,0.1"],
    "entropy tau": ["entropy:inf,3", "entropy:3,3", "entropy:1.5,3", "entropy:0,3"],
    "entropy m": ["entropy:1,1", "entropy:1,2", "entropy:1,4", "entropy:1,50"],
}


def _laws(R: int = 400, V: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """R target laws from peaked to flat (Dirichlet with concentrations 0.02..5), a draft each."""
    g = np.random.default_rng(seed)
    p = np.stack([g.dirichlet([a] * V) for a in np.geomspace(0.02, 5.0, R)])
    x = g.integers(0, V, R)
    x[::3] = p[::3].argsort(-1)[:, -2]  # a third of the drafts are the target's second choice
    return torch.tensor(x), torch.tensor(p, dtype=torch.float32)


# -- the rules as pure functions ------------------------------------------------------------------


def test_hand_cases():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])  # H = 1.14 nats, exp(-H) = 0.32
    H = float(entropy(p))
    assert H == pytest.approx(-(0.5 * np.log(0.5) + 0.3 * np.log(0.3) + 0.15 * np.log(0.15) + 0.05 * np.log(0.05)), abs=1e-6)
    each = [torch.tensor([i]) for i in range(5)]
    # typical: bar = min(eps, delta * exp(-H)); eps 0.2, delta 1: bar = min(0.2, 0.32) = 0.2
    assert [bool(typical_passes(x, p, 0.2, 1.0)) for x in each] == [True, True, False, False, False]
    # eps 0.5, delta 0.5: bar = min(0.5, 0.16) = 0.16: a flat enough p lowers the bar under eps
    assert [bool(typical_passes(x, p, 0.5, 0.5)) for x in each] == [True, True, False, False, False]
    assert [bool(typical_passes(x, p, 0.5, 0.4)) for x in each] == [True, True, True, False, False]
    # topm: among the 3 most likely and p(x) >= 0.4 * 0.5
    assert [bool(topm_passes(x, p, 3, 0.4)) for x in each] == [True, True, False, False, False]
    assert [bool(topm_passes(x, p, 3, 0.0)) for x in each] == [True, True, True, False, False]
    assert [bool(topm_passes(x, p, 5, 0.0)) for x in each] == [True, True, True, True, False]  # never p(x) = 0
    # entropy-gated: only where H >= tau
    assert [bool(entropy_passes(x, p, 1.0, 2)) for x in each] == [True, True, False, False, False]
    assert not entropy_passes(torch.tensor([1]), p, 1.2, 2)


def test_rank_breaks_ties_as_argmax_does():
    p = torch.tensor([[0.1, 0.4, 0.1, 0.4]])
    assert int(p.argmax()) == 1
    assert [int(rank(torch.tensor([i]), p)) for i in range(4)] == [2, 0, 3, 1]
    assert not topm_passes(torch.tensor([3]), p, 1, 0.0)  # the tied token is not the target's choice


@pytest.mark.parametrize("name", list(SWEEPS))
def test_each_rule_is_monotone_in_its_parameter(name):
    x, p = _laws()
    masks = [relaxed_passes(x, p, AcceptanceConfig.parse(s)) for s in SWEEPS[name]]
    for stricter, looser, s in zip(masks, masks[1:], SWEEPS[name][1:]):
        assert bool((stricter <= looser).all()), f"{s} rejects a draft the stricter setting passed"
    assert masks[-1].sum() > masks[0].sum(), "the sweep never loosened anything: the test could not fail"


@pytest.mark.parametrize("limit", GREEDY_LIMITS)
def test_at_its_limit_a_rule_passes_only_the_targets_own_choice(limit):
    x, p = _laws()
    passes = relaxed_passes(x, p, AcceptanceConfig.parse(limit))
    assert bool((~passes | (x == p.argmax(-1))).all())
    assert limit in GREEDY_LIMITS[len(LIMITS):] or not passes.any()
    assert not relaxed_passes(x, p, AcceptanceConfig()).any()  # exact adds nothing


def test_a_token_outside_the_targets_law_never_passes():
    x, p = _laws()
    p[torch.arange(len(x)), x] = 0.0
    p = p / p.sum(-1, keepdim=True)
    for s in ("typical:0.01,0", "topm:50,0", "entropy:0,50"):
        assert not relaxed_passes(x, p, AcceptanceConfig.parse(s)).any(), s


# -- one round ------------------------------------------------------------------------------------


def test_a_relaxed_round_accepts_at_least_what_the_exact_one_does():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        K, V = 4, 6
        logits = torch.randn(K + 1, V, generator=g) * 2
        draft = torch.where(torch.rand(K, generator=g) < 0.6, logits[:K].argmax(-1), torch.randint(0, V, (K,), generator=g))
        passes = relaxed_passes(draft, logits[:K].softmax(-1), AcceptanceConfig.parse("topm:2,0.3"))
        n_exact, nxt_exact = accept_greedy(draft, logits)
        n, nxt = accept_greedy(draft, logits, passes)
        assert n >= n_exact
        assert nxt == int(logits[n].argmax())  # after the accepted drafts: the target's own token
        assert accept_greedy(draft, logits, torch.zeros(K, dtype=torch.bool)) == (n_exact, nxt_exact)


def test_a_relaxed_tree_walk_takes_the_targets_child_first_then_one_that_passes():
    parents = [-1, -1, 0, 1]  # root -> drafts 0, 1; 0 -> 2; 1 -> 3
    logits = torch.full((5, 6), -5.0)
    logits[0, 4], logits[0, 5] = 5.0, 4.0  # root: the target wants 4, 5 is close behind
    logits[2, 1] = 5.0  # after draft 1 (token 5): the target wants 1
    logits[4, 2] = 5.0
    tokens = torch.tensor([3, 5, 0, 1])
    assert accept_greedy_tree(tokens, parents, logits) == ([0], 4)
    passes = torch.tensor([False, True, False, False])
    assert accept_greedy_tree(tokens, parents, logits, passes) == ([0, 2, 4], 2)
    tokens = torch.tensor([4, 5, 0, 1])  # the target's own child exists: it is taken, not the passing one
    assert accept_greedy_tree(tokens, parents, logits, passes)[0][:2] == [0, 1]


def test_with_nothing_passing_sampling_is_the_exact_rule_draw_for_draw():
    V, K = 5, 3
    g = torch.Generator().manual_seed(1)
    for seed in range(100):
        p = torch.softmax(torch.randn(K + 1, V, generator=g), -1)
        q = torch.softmax(torch.randn(K, V, generator=g), -1)
        draft = torch.multinomial(q, 1, generator=g)[:, 0]
        none = torch.zeros(K, dtype=torch.bool)
        a = accept_speculative(draft, q, p, torch.Generator().manual_seed(seed))
        assert accept_speculative(draft, q, p, torch.Generator().manual_seed(seed), none) == a
        assert accept_speculative(draft, q, p, torch.Generator().manual_seed(seed), ~none)[0] == K  # all pass surely
        parents = [-1, 0, -1]
        b = accept_speculative_tree(draft, parents, q, torch.softmax(torch.randn(K + 1, V, generator=g), -1),
                                    torch.Generator().manual_seed(seed))
        assert len(b[0]) >= 1


# -- decoding -------------------------------------------------------------------------------------


def _prompts() -> list[torch.Tensor]:
    return [torch.randint(4, 97, (1, n), generator=torch.Generator().manual_seed(n)) for n in (3, 11, 40)]


def test_exact_is_the_default_and_says_so():
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    ids = _prompts()[0]
    out = mtpspec.generate(model, head, ids, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    assert out.stats.acceptance == "exact" and out.stats.to_dict()["exact"] is True
    assert torch.equal(out.sequences, hf_greedy(model, ids, 12, eos=[]))
    loose = mtpspec.generate(model, head, ids, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[],
                             acceptance="topm:3,0.1")
    assert loose.stats.to_dict()["acceptance"] == "topm:3,0.1" and loose.stats.to_dict()["exact"] is False


@pytest.mark.parametrize("limit", GREEDY_LIMITS)
def test_at_its_limit_each_rule_decodes_exactly_greedy(limit):
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    for ids in _prompts():
        ref = hf_greedy(model, ids, 24, eos=[])
        oracle = OracleDrafter(ref[0].tolist(), vocab=97, seed=ids.shape[1])
        drafters = [(head, 3), (oracle, 4), (TreeDrafter(head, TreeConfig(width=2, beam=2)), 6), (SwitchDrafter(head), 4)]
        for drafter, k in drafters:
            out = mtpspec.generate(model, drafter, ids, max_new_tokens=24, num_draft_tokens=k, eos_token_id=[],
                                   acceptance=limit)
            assert torch.equal(out.sequences, ref), (limit, type(drafter).__name__, ids.shape[1])
            assert out.stats.acceptance == AcceptanceConfig.parse(limit).label


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("tree", [False, True])
def test_at_its_limit_each_rule_samples_exactly_seed_for_seed(limit, tree):
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    kw = dict(max_new_tokens=20, num_draft_tokens=4, eos_token_id=[], temperature=0.9, top_k=30, tree=tree)
    for seed, ids in enumerate(_prompts()):
        exact = mtpspec.generate(model, head, ids, seed=seed, **kw)
        relaxed = mtpspec.generate(model, head, ids, seed=seed, acceptance=limit, **kw)
        assert torch.equal(relaxed.sequences, exact.sequences), (limit, seed)


def test_a_loose_rule_accepts_more_and_keeps_only_what_it_passes():
    """Every drafted token a relaxed run kept passes the rule against the target's own logits at
    its position (or is the target's argmax); every other token is the target's argmax."""
    model = tiny_model("llama")
    target = mtpspec.Target(model)
    head = mtpspec.MTPHead.for_target(target)
    rule = AcceptanceConfig.parse("topm:3,0")
    gained, changed = 0.0, 0
    for ids in _prompts():
        T = ids.shape[1]
        exact = mtpspec.generate(target, head, ids, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
        rounds = []
        out = mtpspec.generate(target, head, ids, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[],
                               acceptance=rule, on_tokens=rounds.append)
        gained += out.stats.mean_accepted - exact.stats.mean_accepted
        changed += not torch.equal(out.sequences, exact.sequences)
        drafted = [d for r in rounds for d in r.drafted]
        logits = model(out.sequences).logits[0, T - 1:-1].float()  # (n, V): the target's prediction for each new token
        new = out.sequences[0, T:]
        own = new == logits.argmax(-1)
        ok = relaxed_passes(new, logits.softmax(-1), rule) | own
        assert bool(ok[torch.tensor(drafted)].all()) and bool(own[~torch.tensor(drafted)].all())
    assert gained > 0 and changed > 0, (gained, changed)


@pytest.mark.parametrize("text, message", [
    ("lenient", "must be one of exact, typical, topm, entropy"),
    ("typical:0", "0 < eps <= 1"),
    ("typical:0.1,-1", "delta >= 0"),
    ("topm:-1", "whole m >= 0"),
    ("topm:2.5", "whole m >= 0"),
    ("topm:3,1.5", "0 <= alpha <= 1"),
    ("entropy:-1", "tau >= 0"),
    ("entropy:1,2,3", "at most 2 value(s)"),
    ("topm:tau=1", "no parameter 'tau'"),
    ("typical:x", "eps must be a number"),
    ("exact:1", "at most 0 value(s)"),
])
def test_bad_parameters_are_an_input_error_that_says_which(text, message):
    with pytest.raises(mtpspec.InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AcceptanceConfig.parse(text)
    with pytest.raises(mtpspec.InputError, match="takes m and alpha, not eps"):
        AcceptanceConfig(rule="topm", eps=0.1)
    model = tiny_model("llama")
    with pytest.raises(mtpspec.InputError):
        mtpspec.generate(model, None, _prompts()[0], max_new_tokens=2, acceptance=text)


def test_the_label_reads_back_as_the_same_rule():
    for text in ("exact", "typical:0.09", "typical:1,inf", "topm:3,0.3", "topm:alpha=0.5", "entropy:2", "entropy:inf,1"):
        a = AcceptanceConfig.parse(text)
        assert AcceptanceConfig.parse(a.label) == a, text
    assert AcceptanceConfig.parse("typical:0.09").delta == pytest.approx(0.3)  # Medusa's pairing
    assert AcceptanceConfig.parse("typical:0.4").label == "typical:0.4"  # sqrt(eps) goes without saying
    assert AcceptanceConfig.parse("typical:0.4,0.5").label == "typical:0.4,0.5"
    assert AcceptanceConfig.parse(None) == AcceptanceConfig() and AcceptanceConfig().exact


def test_among_top_is_rank_below_m_ties_included():
    x, p = _laws()
    p[::7, 3] = p[::7].max(-1).values  # ties with the most likely token
    x[::14] = 3
    for m in (0, 1, 2, 3, 10, 50, 60):
        assert torch.equal(among_top(x, p, m), rank(x, p) < m), m
