"""Draft trees: masks and positions match ones drawn by hand, paths follow parents, greedy
decoding with a tree drafter equals HF greedy token for token on every family, and so does
sampling with top_k = 1 (a sampled tree round keeps the right path in the cache)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import FAMILIES, hf_greedy, tiny_model

import mtpspec
from mtpspec import Draft
from mtpspec.core.decode import _spine_first
from mtpspec.core.tree import TreeLayout, children, depths, path_to, positions, spine_first, tree_mask
from mtpspec.core.verify import accept_greedy_tree

#        root(0)
#       /      \
#   d0(1)      d1(2)
#   /   \         \
# d2(3) d3(4)     d4(5)
#   |
# d5(6)
PARENTS = [-1, -1, 0, 0, 1, 2]

# The same shape of draft, spine first: a leading chain d0 d1 d2 d3 (rows 0..4 attend the cache
# itself), then side branches at depths 1, 2, 3 and 2, 3 below them.
#   root(0) - d0(1) - d1(2) - d2(3) - d3(4)
#     |         |       \
#   d4(5)     d5(6)     d6(7)
#     |         |
#   d7(8)     d8(9)
SPINE_TREE = [-1, 0, 1, 2, -1, 0, 1, 4, 5]
# A tree whose spine (d0 d3 d4) is scattered among side branches at depths 1, 2 and 3.
SCATTERED = [-1, -1, 1, 0, 3, 0, 5, 2]


def test_mask_matches_hand_drawn():
    want = torch.tensor([
        # 0  1  2  3  4  5  6
        [1, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0],  # d0
        [1, 0, 1, 0, 0, 0, 0],  # d1
        [1, 1, 0, 1, 0, 0, 0],  # d2 <- d0
        [1, 1, 0, 0, 1, 0, 0],  # d3 <- d0
        [1, 0, 1, 0, 0, 1, 0],  # d4 <- d1
        [1, 1, 0, 1, 0, 0, 1],  # d5 <- d2 <- d0
    ], dtype=torch.bool)
    assert torch.equal(tree_mask(PARENTS), want)


def test_chain_mask_is_causal_and_positions_consecutive():
    assert torch.equal(tree_mask([-1, 0, 1]), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert positions([-1, 0, 1], 10).tolist() == [10, 11, 12, 13]


def test_depths_positions_paths_children():
    assert depths(PARENTS) == [0, 1, 1, 2, 2, 2, 3]
    assert positions(PARENTS, 7).tolist() == [7, 8, 8, 9, 9, 9, 10]
    assert path_to(PARENTS, 6) == [0, 1, 3, 6]
    assert path_to(PARENTS, 5) == [0, 2, 5]
    assert path_to(PARENTS, 0) == [0]
    assert children(PARENTS) == [[1, 2], [3, 4], [5], [6], [], [], []]


def test_a_layout_lists_each_rows_ancestors_in_depth_order_as_drawn():
    layout = TreeLayout.from_parents(PARENTS)
    assert layout.rows == 7 and not layout.is_chain and layout.spine == 2  # root, d0; d1 is not d0's child
    assert torch.equal(layout.mask, tree_mask(PARENTS))
    assert layout.positions(7).tolist() == [7, 8, 8, 9, 9, 9, 10]
    assert layout.nanc.tolist() == [1, 2, 2, 3, 3, 3, 4]
    P = 7  # padding past each row's ancestors
    assert layout.anc.tolist() == [
        [0, P, P, P, P, P, P],
        [0, 1, P, P, P, P, P],
        [0, 2, P, P, P, P, P],
        [0, 1, 3, P, P, P, P],
        [0, 1, 4, P, P, P, P],
        [0, 2, 5, P, P, P, P],
        [0, 1, 3, 6, P, P, P],
    ]
    assert layout.nanc.dtype == layout.anc.dtype == torch.int32 and layout.anc.is_contiguous()
    assert TreeLayout.from_parents(SPINE_TREE).spine == 5  # root and the leading chain d0..d3


@pytest.mark.parametrize("parents", [[], [-1], [-1, 0, 1]])
def test_a_chain_is_a_chain_layout(parents):
    layout = TreeLayout.from_parents(parents)
    assert layout.is_chain and layout.spine == layout.rows == len(parents) + 1
    assert layout.positions(3).tolist() == list(range(3, 3 + layout.rows))


@pytest.mark.parametrize("parents", [PARENTS, SPINE_TREE, SCATTERED, [-1, 0, 1]])
def test_a_layout_from_a_mask_is_the_layout_from_its_parents(parents):
    a, b = TreeLayout.from_mask(tree_mask(parents)), TreeLayout.from_parents(parents)
    assert a.parents == b.parents == tuple(parents) and a.spine == b.spine
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("depths", "mask", "nanc", "anc"))


@pytest.mark.parametrize("mask", [
    torch.ones(3, 3, dtype=torch.bool),  # rows see later rows
    torch.eye(3, dtype=torch.bool),  # drafts that do not see the root
    torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool),  # sees its parent but not the root
    torch.ones(2, 3, dtype=torch.bool),
])
def test_a_mask_that_is_no_trees_is_refused(mask):
    with pytest.raises(mtpspec.InputError, match="mask"):
        TreeLayout.from_mask(mask)


@pytest.mark.parametrize("bad", [[0], [-1, 1], [-2]])
def test_bad_parents_are_refused(bad):
    with pytest.raises(mtpspec.InputError, match="parent"):
        tree_mask(bad)


def test_spine_first_on_a_hand_drawn_tree():
    # PARENTS' spine: d0, its first child d2, its first child d5; then d1 d3 d4 as they came
    order, parents = spine_first(PARENTS)
    assert order == [0, 2, 5, 1, 3, 4]
    assert parents == [-1, 0, 1, -1, 0, 3]
    assert [PARENTS[o] for o in order] == [-1 if p == -1 else order[p] for p in parents]  # same edges
    mask = tree_mask(parents)  # root and spine: a leading chain of four verify rows
    assert torch.equal(mask[:4, :4], torch.ones(4, 4, dtype=torch.bool).tril()) and not mask[:4, 4:].any()
    # the spine's first child may come after its siblings' subtrees
    assert spine_first([-1, -1, 1, 0]) == ([0, 3, 1, 2], [-1, 0, -1, 2])


@pytest.mark.parametrize("parents", [PARENTS, SPINE_TREE, [-1, -1, -1, 2, 0], [-1, 0, 1, 2], [-1], []])
def test_spine_first_is_idempotent_and_leaves_chains_alone(parents):
    order, new = spine_first(parents)
    assert sorted(order) == list(range(len(parents)))
    assert all(-1 <= p < i for i, p in enumerate(new))  # still topological
    assert spine_first(new) == (list(range(len(new))), new)
    if parents == list(range(-1, len(parents) - 1)):
        assert (order, new) == (list(range(len(parents))), parents)


def test_spine_first_draft_permutes_tokens_and_q_together():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15])
    q = torch.nn.functional.one_hot(tokens, 20).float()  # (N, V): row i is draft i's own law
    d = _spine_first(Draft(tokens=tokens, parents=torch.tensor(PARENTS), q=q))
    assert d.tokens.tolist() == [10, 12, 15, 11, 13, 14]
    assert d.parent_list() == [-1, 0, 1, -1, 0, 3]
    assert torch.equal(d.q.argmax(-1), d.tokens)
    chain = Draft(tokens=tokens[:3])
    assert _spine_first(chain) is chain


def test_greedy_tree_acceptance_follows_the_argmax_branch():
    V = 10
    tokens = torch.tensor([4, 5, 6, 7, 8, 9])  # d0..d5
    logits = torch.zeros(7, V)
    logits[0, 5] = 1  # root -> target wants 5: d1
    logits[2, 8] = 1  # after d1 -> 8: d4
    logits[5, 2] = 1  # after d4 -> 2: no child, stop
    path, nxt = accept_greedy_tree(tokens, PARENTS, logits)
    assert path == [0, 2, 5] and nxt == 2
    logits[0] = 0
    logits[0, 1] = 1  # no child of the root matches: nothing accepted
    assert accept_greedy_tree(tokens, PARENTS, logits) == ([0], 1)


def test_cache_keep_moves_a_tree_path_into_place():
    t = mtpspec.Target(tiny_model("llama"))
    c = t.new_cache(32)
    t.forward(torch.tensor([[5, 6, 7, 8, 9, 10, 11]]), c)
    before = c.keys.clone()
    c.keep(2, [0, 2, 4])
    assert c.length == 5
    assert torch.equal(c.keys[:, :, :2], before[:, :, :2])
    assert torch.equal(c.keys[:, :, 2:5], before[:, :, [2, 4, 6]])
    c.keep(3, [0])
    assert c.length == 4
    with pytest.raises(mtpspec.InputError, match="ascend"):
        c.keep(1, [2, 1])


class OracleTree:
    """A tree of `width` siblings per level along the true continuation: one sibling carries the
    true token, at a random index, except that with probability `miss` a level has none."""

    hidden_layers = (-1,)

    def __init__(self, continuation: list[int], vocab: int, width: int = 2, seed: int = 0, miss: float = 0.3):
        self.cont, self.vocab, self.width, self.miss = continuation, vocab, width, miss
        self.rng = random.Random(seed)
        self.rounds: list[tuple[int, int]] = []

    def propose(self, inp, k, sampling, generator) -> Draft:
        done = inp.tokens.shape[1]
        tokens, parents, spine = [], [], -1
        depth = 0
        while len(tokens) < k:
            true = self.cont[done + depth] if done + depth < len(self.cont) else 0
            hit = self.rng.random() >= self.miss
            slot = self.rng.randrange(self.width) if hit else -1
            next_spine = None
            for j in range(self.width):
                if len(tokens) == k:
                    break
                tok = true if j == slot else (true + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
                tokens.append(tok)
                parents.append(spine)
                if j == slot:
                    next_spine = len(tokens) - 1
            if next_spine is None:
                break
            spine, depth = next_spine, depth + 1
        while len(tokens) < k:  # pad with leaves under the root that never match
            tokens.append((self.cont[done] + 1) % self.vocab if done < len(self.cont) else 1)
            parents.append(-1)
        return Draft(tokens=torch.tensor(tokens), parents=torch.tensor(parents))

    def update(self, drafted, accepted):
        self.rounds.append((drafted, accepted))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("nodes", [3, 8])
def test_tree_greedy_equals_hf_greedy(family, nodes):
    model = tiny_model(family)
    total_accepted = 0
    for seed, length in enumerate((1, 9, 60)):
        ids = torch.randint(4, 97, (1, length), generator=torch.Generator().manual_seed(seed))
        ref = hf_greedy(model, ids, 40, eos=[])
        tree = OracleTree(ref[0].tolist(), vocab=97, width=2, seed=seed)
        out = mtpspec.generate(model, tree, ids, max_new_tokens=40, num_draft_tokens=nodes, eos_token_id=[])
        assert torch.equal(out.sequences, ref), (family, nodes, length)
        total_accepted += sum(a for _, a in tree.rounds)
    assert total_accepted > 0  # the tree really got paths accepted, beyond the root


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sampled_tree_with_top_k_1_is_greedy(family):
    """Sampling with top_k = 1 can only emit the argmax: a sampled tree round that keeps the
    wrong path in the cache, or emits the wrong token, shows up as a difference from greedy."""
    model = tiny_model(family)
    ids = torch.randint(4, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    ref = hf_greedy(model, ids, 40, eos=[])
    tree = OracleTree(ref[0].tolist(), vocab=97, width=3, seed=1)
    out = mtpspec.generate(model, tree, ids, max_new_tokens=40, num_draft_tokens=8, eos_token_id=[],
                           temperature=1.0, top_k=1, seed=0)
    assert torch.equal(out.sequences, ref)
    assert sum(a for _, a in tree.rounds) > 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_tree_equals_plain_decoding(family):
    """A tree row attends its own gathered copy of the cache, laid out as plain decoding would
    see it, so in bf16 too the tree's output is plain decoding's, token for token."""
    model = tiny_model(family).to(torch.bfloat16)
    for seed, length in enumerate((2, 30, 120)):
        ids = torch.randint(4, 97, (1, length), generator=torch.Generator().manual_seed(seed))
        plain = mtpspec.generate(model, None, ids, max_new_tokens=40, num_draft_tokens=0, eos_token_id=[])
        tree = OracleTree(plain.sequences[0].tolist(), vocab=97, width=3, seed=seed, miss=0.2)
        out = mtpspec.generate(model, tree, ids, max_new_tokens=40, num_draft_tokens=9, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences), (family, length)
        assert sum(a for _, a in tree.rounds) > 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("parents", [
    PARENTS,  # the root branches at once: only root and d0 attend the cache itself
    SPINE_TREE,  # a spine of four drafts on the cache, side branches on copies at depths 1 to 3
    SCATTERED,  # as drafted: only root and d0 on the cache
    spine_first(SCATTERED)[1],  # the same tree spine first: root, d0, d3, d4 on the cache
    [-1, 0, 1, 2],  # a chain passed as a tree: all rows on the cache
    [-1, 0, 1, -1, 3, 4, 5, 6, 1],  # a branch of five (a lookup branch) longer than the spine, and a leaf
])
@pytest.mark.parametrize("family, extra", [("llama", {}), ("mistral", {"sliding_window": 6})])
@pytest.mark.parametrize("engine", ["auto", "torch"])  # the fused forward where it runs, and op by op
def test_tree_verify_rows_are_bitwise_plain_decoding(dtype, parents, family, extra, engine):
    """The logits of every tree node equal, bit for bit, the logits of decoding its path one
    token at a time (the property behind exact tree verification in any dtype), whether the
    node attends the cache itself (a leading chain) or a copy of it, also past a sliding window."""
    model = tiny_model(family, hidden_size=64, intermediate_size=128, initializer_range=0.1, **extra).to(dtype)
    t = mtpspec.Target(model, engine=engine)
    if dtype == torch.float32 and not t.plan.row_invariant:
        pytest.skip(f"this CPU has no row-invariant fp32 kernels ({t.plan}; seen on an AMD EPYC): fp32 is exact "
                    "up to rounding there, as the plan says")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, 97, (1, 37), generator=g)
    tokens = torch.randint(4, 97, (len(parents),), generator=g)
    cache = t.new_cache(128)
    t.forward(prompt[:, :-1], cache)
    rows = torch.cat([prompt[:, -1:], tokens[None]], 1)
    tree = t.forward(rows, cache, layout=TreeLayout.from_parents(parents)).logits[0]  # positions L + depth
    for node in range(len(parents) + 1):
        path = path_to(parents, node)
        plain = t.new_cache(128)
        t.forward(prompt[:, :-1], plain)
        for r in path:
            logits = t.forward(rows[:, r:r + 1], plain).logits[0, 0]
        assert torch.equal(logits, tree[node]), (dtype, parents, family, node)


@pytest.mark.parametrize("engine", ["auto", "torch"])
def test_a_tree_given_as_its_mask_verifies_as_its_layout_does(engine):
    """Callers that pass `positions` and `tree_mask` get the same bits as those that pass a
    layout; a mask with a layout, or a layout of another size, is refused."""
    t = mtpspec.Target(tiny_model("llama").to(torch.bfloat16), engine=engine)
    g = torch.Generator().manual_seed(1)
    prompt, rows = torch.randint(4, 97, (1, 20), generator=g), torch.randint(4, 97, (1, len(SCATTERED) + 1), generator=g)
    outs = []
    for kw in ({"layout": TreeLayout.from_parents(SCATTERED)}, {"positions": positions(SCATTERED, 20), "tree_mask": tree_mask(SCATTERED)}):
        cache = t.new_cache(64)
        t.forward(prompt, cache)
        outs.append(t.forward(rows, cache, hidden_layers=(-2, -1), **kw))
        assert cache.length == 20 + rows.shape[1]
    assert torch.equal(outs[0].logits, outs[1].logits) and torch.equal(outs[0].hidden, outs[1].hidden)
    with pytest.raises(mtpspec.InputError, match="not both"):
        t.forward(rows, t.new_cache(64), layout=TreeLayout.from_parents(SCATTERED), tree_mask=tree_mask(SCATTERED))
    with pytest.raises(mtpspec.InputError, match="rows"):
        t.forward(rows[:, :3], t.new_cache(64), layout=TreeLayout.from_parents(SCATTERED))
