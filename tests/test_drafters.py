"""Tree, prompt-lookup and hybrid drafters: well-formed trees, the lookup rule on hand-made
texts, greedy output identical to HF greedy whatever they propose, and sampling with each of
them (its exactness is tested in test_sampling.py and test_verify.py)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import FAMILIES, hf_greedy, tiny_model

import mtpspec
from mtpspec import DraftInput, SamplingConfig
from mtpspec.core.drafters import (
    FALLBACK_K,
    FUSED_COSTS,
    HYBRID_LOOKUP,
    SWITCH_TOKENS,
    TREE_NODES,
    TREE_SHAPE,
    HybridDrafter,
    LookupDrafter,
    RoundCosts,
    SwitchDrafter,
    TreeConfig,
    TreeDrafter,
    build_drafter,
    lookup,
    tree_shape,
)
from mtpspec.core.tree import children, spine_first


def test_lookup_finds_the_latest_longest_match():
    #            0  1  2  3  4  5  6  7  8  9
    assert lookup([5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6, 7], 3) == [1, 5, 6]  # "5 6 7" last seen at 5
    assert lookup([1, 2, 3, 4, 2], 2) == [3, 4]  # only the 1-gram "2" matches
    assert lookup([1, 2, 3], 4) == []  # nothing repeats
    assert lookup([4, 4, 4, 4], 8) == [4]  # the match may run into the tail


def _input(model, ids):
    t = mtpspec.Target(model)
    cache = t.new_cache(256)
    out = t.forward(ids[:, :-1], cache)
    return t, DraftInput(tokens=ids, hidden=out.hidden[:, -1], cache=cache)


def test_tree_is_well_formed_and_width_one_is_the_chain():
    model = tiny_model("llama")
    ids = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    t, inp = _input(model, ids)
    head = mtpspec.MTPHead.for_target(t)
    d = TreeDrafter(head, TreeConfig(width=3, beam=2, max_depth=4)).propose(inp, 9, SamplingConfig(), None)
    parents = d.parent_list()
    assert len(parents) == 9 and all(-1 <= p < i for i, p in enumerate(parents))
    assert sum(p == -1 for p in parents) <= 3  # at most `width` children under the root
    chain = head.propose(inp, 4, SamplingConfig(), None).tokens
    narrow = TreeDrafter(head, TreeConfig(width=1, beam=1, max_depth=4)).propose(inp, 4, SamplingConfig(), None)
    assert narrow.is_chain and torch.equal(narrow.tokens, chain)


def test_the_spine_verified_first_is_the_heads_greedy_chain():
    """Decoding verifies a tree spine first (the first child, repeatedly): for the head's tree
    that is its most likely path, a prefix of the head's own greedy chain; for the hybrid, the
    lookup branch."""
    model = tiny_model("llama")
    base = torch.randint(4, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([base, base[:, :4]], 1)
    t, inp = _input(model, ids)
    head = mtpspec.MTPHead.for_target(t)
    d = TreeDrafter(head, TreeConfig(width=3, beam=2, max_depth=4)).propose(inp, 9, SamplingConfig(), None)
    order, parents = spine_first(d.parent_list())
    spine = next((j for j, p in enumerate(parents) if p != j - 1), len(parents))  # leading chain length
    assert not d.is_chain and 1 <= spine < 9
    chain = head.propose(inp, 4, SamplingConfig(), None).tokens
    assert d.tokens[order[:spine]].tolist() == chain[:spine].tolist()
    hyb = HybridDrafter(head, lookup_tokens=3)
    order, _ = spine_first(hyb.propose(inp, 8, SamplingConfig(), None).parent_list())
    assert order[:3] == [0, 1, 2]  # the lookup branch leads


@pytest.mark.parametrize("family", [f if f == "llama" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_tree_and_hybrid_greedy_equal_hf_greedy(family):
    model = tiny_model(family)
    head = mtpspec.MTPHead.for_target(model)
    for seed, length in enumerate((3, 40)):
        base = torch.randint(4, 97, (1, length), generator=torch.Generator().manual_seed(seed))
        ids = torch.cat([base, base], 1)  # a repeated prompt: lookup finds matches
        ref = hf_greedy(model, ids, 32, eos=[])
        for drafter in (TreeDrafter(head, TreeConfig(width=2, beam=2)), HybridDrafter(head, lookup_tokens=3),
                        LookupDrafter(), SwitchDrafter(head, head_tokens=3),
                        TreeDrafter(head, TreeConfig(width=3, beam=2, min_branch_prob=0.2)),
                        TreeDrafter(head, TreeConfig(width=3, beam=2, costs=RoundCosts(row=0.0, plane=0.01, step=0.0))),
                        TreeDrafter(head, TREE_SHAPE), TreeDrafter(head, tree_shape("fused"))):
            out = mtpspec.generate(model, drafter, ids, max_new_tokens=32, num_draft_tokens=6, eos_token_id=[])
            assert torch.equal(out.sequences, ref), (family, type(drafter).__name__, length)
    out = mtpspec.generate(model, head, ids, max_new_tokens=32, num_draft_tokens=6, eos_token_id=[], tree=True)
    assert torch.equal(out.sequences, ref)


def test_hybrid_merges_the_lookup_branch_into_the_tree():
    model = tiny_model("llama")
    base = torch.randint(4, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([base, base[:, :4]], 1)  # the tail "b0 b1 b2 b3" occurred at the start
    t, inp = _input(model, ids)
    hyb = HybridDrafter(mtpspec.MTPHead.for_target(t), lookup_tokens=3)
    d = hyb.propose(inp, 8, SamplingConfig(), None)
    assert hyb.last_branch == 3 and d.tokens[:3].tolist() == base[0, 4:7].tolist()
    assert d.parent_list()[:3] == [-1, 0, 1]
    pairs = list(zip(d.parent_list(), d.tokens.tolist()))
    assert len(pairs) == len(set(pairs)) == 8  # no (parent, token) twice


def test_tree_needs_a_head():
    model = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    with pytest.raises(mtpspec.InputError, match="MTPHead"):
        mtpspec.generate(model, LookupDrafter(), ids, max_new_tokens=8, num_draft_tokens=4, tree=True)


def test_sampled_trees_run_and_greedy_trees_stay_plain():
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    base = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(5))
    ids = torch.cat([base, base], 1)
    plain = mtpspec.generate(model, None, ids, max_new_tokens=24, num_draft_tokens=0, eos_token_id=[])
    tree = mtpspec.generate(model, head, ids, max_new_tokens=24, num_draft_tokens=8, eos_token_id=[], tree=True)
    assert torch.equal(tree.sequences, plain.sequences)
    sampling = dict(max_new_tokens=24, num_draft_tokens=8, eos_token_id=[], temperature=0.8, top_k=20, top_p=0.95)
    first = mtpspec.generate(model, head, ids, tree=True, seed=1, **sampling)
    assert first.sequences.shape == (1, ids.shape[1] + 24) and first.stats.rounds > 0
    assert torch.equal(first.sequences, mtpspec.generate(model, head, ids, tree=True, seed=1, **sampling).sequences)
    others = {tuple(mtpspec.generate(model, head, ids, tree=True, seed=s, **sampling).sequences[0].tolist())
              for s in range(2, 5)}
    assert len(others | {tuple(first.sequences[0].tolist())}) > 1  # the seed matters
    for drafter in (HybridDrafter(head, lookup_tokens=3), LookupDrafter(), SwitchDrafter(head)):
        out = mtpspec.generate(model, drafter, ids, seed=1, **sampling)
        assert out.sequences.shape == first.sequences.shape, type(drafter).__name__


def test_switch_drafts_the_lookup_when_the_text_repeats_else_the_heads_chain():
    model = tiny_model("llama")
    base = torch.randint(4, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    t, inp = _input(model, torch.cat([base, base[:, :4]], 1))  # the tail "b0 b1 b2 b3" occurred at the start
    head = mtpspec.MTPHead.for_target(t)
    switch = SwitchDrafter(head, head_tokens=3)
    d = switch.propose(inp, 5, SamplingConfig(), None)
    assert switch.last == "lookup" and d.is_chain and d.tokens.tolist() == base[0, 4:9].tolist()
    fresh = torch.arange(20, 34)[None]  # nothing repeats
    t, inp = _input(model, fresh)
    d = switch.propose(inp, 5, SamplingConfig(), None)
    assert switch.last == "head" and d.tokens.tolist() == head.propose(inp, 3, SamplingConfig(), None).tokens.tolist()
    with pytest.raises(mtpspec.InputError, match="min_lookup"):
        SwitchDrafter(head, min_lookup=0)


def test_a_branch_floor_keeps_the_spine_and_drops_unlikely_branches():
    """TreeConfig.min_branch_prob: the head's greedy chain stays whole; every other node kept
    has at least that cumulative draft probability; a floor of 1 leaves the chain alone."""
    model = tiny_model("llama")
    ids = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    t, inp = _input(model, ids)
    head = mtpspec.MTPHead.for_target(t)
    cfg = dict(width=3, beam=2, max_depth=4)
    ranked = TreeDrafter(head, TreeConfig(**cfg)).ranked_nodes(inp, 9)
    chain = head.propose(inp, 4, SamplingConfig(), None).tokens.tolist()
    sizes = []
    for floor in (0.0, 0.02, 0.1, 0.3):
        shaped = TreeDrafter(head, TreeConfig(**cfg, min_branch_prob=floor)).shaped(ranked, 9)
        parents = [n.parent for n in shaped]
        kids = children(parents)
        spine, row = [], 0
        while kids[row]:
            row = kids[row][0]
            spine.append(row - 1)
        assert [shaped[i].token for i in spine] == chain, floor  # the greedy chain, whole
        assert all(shaped[i].score >= math.log(floor) for i in range(len(shaped)) if i not in spine) if floor else True
        assert all(-1 <= p < i for i, p in enumerate(parents)) and len(shaped) <= 9
        sizes.append(len(shaped))
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 9 > sizes[-1]  # a higher floor, fewer branches
    assert TreeDrafter(head, TreeConfig(**cfg, min_branch_prob=1.0)).propose(inp, 9, SamplingConfig(), None).is_chain
    with pytest.raises(mtpspec.InputError, match="min_branch_prob"):
        TreeConfig(min_branch_prob=1.5)


def _spine(parents):
    kids = children(parents)
    spine, row = [], 0
    while kids[row]:
        row = kids[row][0]
        spine.append(row - 1)
    return spine


def test_a_cost_shaped_tree_keeps_only_nodes_that_pay_for_their_price():
    """TreeConfig.costs: every kept node's cumulative draft probability reaches its price (a
    row; a plane too for the first node of a branch, whose probability `branch_credit` scales
    by 1 + the expected continuation) times what a unit of cost bought so far; free
    rows and planes fill the budget; priceless branches leave the head's greedy chain; a head
    step that never pays stops at depth 1; each round moves the running means."""
    model = tiny_model("llama")
    ids = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    t, inp = _input(model, ids)
    head = mtpspec.MTPHead.for_target(t)
    chain = head.propose(inp, 6, SamplingConfig(), None).tokens.tolist()
    free = TreeDrafter(head, TreeConfig(width=3, beam=2, costs=RoundCosts(0.0, 0.0, 0.0), deeper_share=1.0))
    assert len(free.nodes(inp, 9)) == 9 and not free.propose(inp, 9, SamplingConfig(), None).is_chain
    for costs in (RoundCosts(row=0.0, plane=0.01, step=0.0), RoundCosts(row=0.002, plane=0.05, step=0.001)):
        drafter = TreeDrafter(head, TreeConfig(width=3, beam=2, costs=costs))
        nodes = drafter.nodes(inp, 9)
        parents = [n.parent for n in nodes]
        assert all(-1 <= p < i for i, p in enumerate(parents)) and len(nodes) <= 9
        value = drafter.tokens_per_round / drafter.cost_per_round
        spine = _spine(parents)
        assert [nodes[i].token for i in spine] == chain[:len(spine)]
        firsts = {}  # parent -> its first kept child (which continues the parent's chain)
        for i, n in enumerate(nodes):
            firsts.setdefault(n.parent, i)
            starts = firsts[n.parent] != i
            price = costs.row + (costs.plane if starts else 0.0)
            gain = math.exp(n.score)  # branch_credit is off
            assert gain >= price * value, (costs, i)
        rows, planes, steps = drafter._last
        assert rows == len(nodes) + 1 and planes == 1 + sum(firsts[n.parent] != i for i, n in enumerate(nodes))
    only_chain = TreeDrafter(head, TreeConfig(width=3, beam=2, costs=RoundCosts(row=0.0, plane=10.0, step=0.0),
                                              deeper_share=1.0))
    d = only_chain.propose(inp, 6, SamplingConfig(), None)
    assert d.is_chain and d.tokens.tolist() == chain
    shallow = TreeDrafter(head, TreeConfig(width=3, beam=2, costs=RoundCosts(row=0.0, plane=0.0, step=10.0)))
    assert all(n.parent == -1 for n in shallow.nodes(inp, 9)) and shallow._last[2] == 1
    before = (only_chain.tokens_per_round, only_chain.cost_per_round)
    only_chain.update(6, 6)  # a round that kept every draft: 7 tokens for 1 + 6 * 0 + 6 * 0
    assert only_chain.tokens_per_round > before[0] and only_chain.cost_per_round < before[1]
    # branch_credit: rounds that accepted a draft move the continuation, rounds that did not leave
    # it; a larger one opens at least the depth-1 branches a smaller one does, and every kept
    # node's gain, credit included, pays its price.
    c0 = only_chain.continuation
    only_chain.update(6, 0)
    assert only_chain.continuation == c0
    only_chain.update(6, 6)
    assert only_chain.continuation > c0
    costs = RoundCosts(row=0.002, plane=0.2, step=0.001)
    sizes = []
    for credit in (0.0, 0.5, 3.0):
        drafter = TreeDrafter(head, TreeConfig(width=3, beam=2, costs=costs, branch_credit=True))
        drafter.continuation = credit
        nodes = drafter.nodes(inp, 9)
        sizes.append(sum(n.parent == -1 for n in nodes))
        value = drafter.tokens_per_round / drafter.cost_per_round
        firsts = {}
        for i, n in enumerate(nodes):
            firsts.setdefault(n.parent, i)
            starts = firsts[n.parent] != i
            price = costs.row + (costs.plane if starts else 0.0)
            assert math.exp(n.score) * (1.0 + credit if starts else 1.0) >= price * value
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1], sizes
    with pytest.raises(mtpspec.InputError, match="RoundCosts"):
        RoundCosts(row=-1.0)
    with pytest.raises(mtpspec.InputError, match="deeper_share"):
        TreeConfig(deeper_share=0.0)


def test_the_cost_shaped_tree_is_priced_for_the_forward_that_runs():
    """Op by op a branch pays for its own copy of the cache; in the fused forward it pays only
    for its rows, so there the tree prices a plane at 0 (and `mtpspec bench` follows the target)."""
    from mtpspec.measure.bench import BenchConfig

    assert tree_shape("torch").costs == RoundCosts() == TREE_SHAPE.costs
    assert tree_shape("fused").costs == FUSED_COSTS and FUSED_COSTS.plane == 0.0 < RoundCosts().plane
    assert tree_shape("fused", 3).max_depth == 3
    cfg = BenchConfig()
    assert cfg.tree_config("fused").costs == FUSED_COSTS and cfg.tree_config("torch").costs == RoundCosts()
    assert BenchConfig(tree_shape="fixed").tree_config("fused").costs is None


# -- the one drafter factory -------------------------------------------------------------------------
def test_each_kind_builds_its_drafter_with_the_heads_own_defaults():
    """`build_drafter`: a name and a head give one drafter and its k; k left out is the head's own
    (its recorded recommended_k, else FALLBACK_K) for a chain and for a switch's head rounds, and
    the library's tree and lookup sizes otherwise; a tree is priced for the head's target."""
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    assert build_drafter(head, "chain") == (head, FALLBACK_K)
    head.recommended_k = 5
    assert build_drafter(head, "chain") == (head, 5) and build_drafter(head, "chain", k=2) == (head, 2)
    assert build_drafter(None, "chain") == (None, 0)

    tree, k = build_drafter(head, "tree")
    assert isinstance(tree, TreeDrafter) and tree.head is head and k == TREE_NODES
    assert tree.config == tree_shape(head.target.engine)
    fixed = TreeConfig(max_depth=2)
    assert build_drafter(head, "tree", k=4, tree=fixed)[0].config == fixed and build_drafter(head, "tree", k=4)[1] == 4

    hybrid, k = build_drafter(head, "hybrid")
    assert isinstance(hybrid, HybridDrafter) and hybrid.lookup_tokens == HYBRID_LOOKUP and k == TREE_NODES
    assert hybrid.tree.config == tree_shape(head.target.engine)
    assert build_drafter(head, "hybrid", lookup_tokens=2)[0].lookup_tokens == 2

    switch, k = build_drafter(head, "switch")
    assert isinstance(switch, SwitchDrafter) and (switch.head_tokens, switch.lookup_tokens) == (5, SWITCH_TOKENS)
    assert k == max(SWITCH_TOKENS, 5)
    switch, k = build_drafter(head, "switch", k=2, head_k=3)  # the round holds the longer of the two chains
    assert (switch.head_tokens, switch.lookup_tokens, k) == (3, 2, 3)

    look, k = build_drafter(None, "lookup")
    assert isinstance(look, LookupDrafter) and k == SWITCH_TOKENS


def test_the_factory_refuses_what_it_cannot_build():
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    with pytest.raises(mtpspec.InputError, match="Unknown drafter 'medusa'"):
        build_drafter(head, "medusa")
    with pytest.raises(mtpspec.InputError, match="MTPHead"):  # trees come from the head's distributions
        build_drafter(LookupDrafter(), "tree")
    for kind in ("tree", "hybrid", "switch"):
        with pytest.raises(mtpspec.InputError, match="MTPHead"):
            build_drafter(None, kind)
    for kind in ("chain", "tree", "hybrid", "switch"):  # any chain drafter (a Gemma 4 assistant too), but a drafter
        with pytest.raises(mtpspec.InputError, match="is not a Drafter"):
            build_drafter(object(), kind)


def test_generate_drafts_the_heads_own_k_when_none_is_given():
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    ids = torch.randint(4, 97, (1, 8), generator=torch.Generator().manual_seed(0))
    head.recommended_k = 2
    assert mtpspec.generate(model, head, ids, max_new_tokens=6).stats.num_draft_tokens == 2
    assert mtpspec.generate(model, head, ids, max_new_tokens=6, tree=True).stats.num_draft_tokens == TREE_NODES


def test_a_switch_whose_head_k_is_0_drafts_lookups_only():
    """A head whose measured k is 0 (nothing beat plain decoding): a switch round without a
    lookup match drafts nothing, and greedy output is still plain decoding's."""
    model = tiny_model("llama")
    head = mtpspec.MTPHead.for_target(model)
    switch, k = build_drafter(head, "switch", head_k=0)
    t, inp = _input(model, torch.arange(20, 34)[None])  # nothing repeats
    assert switch.propose(inp, k, SamplingConfig(), None).tokens.numel() == 0 and switch.last == "head"
    base = torch.randint(4, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([base, base], 1)
    ref = hf_greedy(model, ids, 16, eos=[])
    assert torch.equal(mtpspec.generate(model, switch, ids, max_new_tokens=16, num_draft_tokens=k, eos_token_id=[]).sequences, ref)
