"""Drafting strategies beyond the head's own chain: a tree from the head, prompt lookup, and a
hybrid of the two verified in one pass. Each is a `Drafter`; the decode loop treats them alike.

Letters: R frontier rows (nodes expanded at one depth), W children per node, V' the head's
(draft) vocabulary, N draft nodes, L committed positions.

Tree (EAGLE-2's idea, Li et al. 2024): expand the head's W most likely next tokens under the
`beam` best nodes of each depth, score every node by its cumulative draft log-probability, and
keep the N best. A child never scores above its parent (log p <= 0), so the N best form a
tree that contains each kept node's ancestors. All nodes of one depth sit at the same position
and share the head's cross-attention to the target's cache, so a depth costs one batched head
step. The children are chosen deterministically, also when sampling: the drafts carry no q and
are verified as point masses (`verify.accept_speculative_tree`), which keeps the target's
distribution exactly. A cost-shaped tree (`TreeConfig.costs`) instead keeps, each round, only
the nodes whose draft probability pays for what they add to the round (a verify row, a copy of
the cache for a new branch, a head step for a new depth), priced in tokens per unit of cost
of the drafter's rounds so far (`branch_credit` also credits a branch's first node with the
drafts its branch is expected to add after it). On this CPU it is the tree that beats the
head's chain.

Prompt lookup (as HF's `prompt_lookup_num_tokens`, Saxena 2023): find the last n-gram of the
text earlier in it and propose what followed. Strong when the answer quotes the prompt
(summaries, extraction, rewriting), useless otherwise; the hybrid puts its branch beside the
head's tree so each round gets the better of the two.

Switch: one chain per round, the lookup continuation when the text repeats, else the head's
chain. A chain verifies on the cache as it is, for about the cost of one token, where every
branch of a tree off its spine attends its own copy of the cache (op by op; the fused
forward attends a branch's ancestors in place, `fused.py`); and a lookup costs no drafting at all.
On this CPU that beat both the head's chain and the trees in wall time (see docs/drafters.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .cache import KVCache
from .draft import Draft, Drafter, DraftInput
from .head import MTPHead
from .target import Target


@dataclass(frozen=True)
class RoundCosts:
    """What the parts of a round cost, as fractions of one target forward over one token. The
    cost-shaped tree keeps a node only where its chance of acceptance pays for what it adds.
    The defaults were measured op by op on a 2-core Xeon with AMX (bf16, SmolLM2-135M, a few
    hundred cached tokens; reports/drafting/tree-shapes/); `mtpspec costs` measures them on yours."""

    # One more verify row that continues a chain (the spine, or a branch's own chain).
    row: float = 0.007
    # One more branch off the spine: op by op, the verify pass attends its own copy of the cache
    # (the fused forward needs no copy: `mtpspec costs` prices a plane near 0 there).
    plane: float = 0.09
    # One more depth of drafting: one batched head step.
    step: float = 0.058

    def __post_init__(self) -> None:
        if min(self.row, self.plane, self.step) < 0:
            raise InputError(f"RoundCosts must be >= 0, got {self}.")


@dataclass(frozen=True)
class TreeConfig:
    # Children expanded under each expanded node: the head's top-W tokens.
    width: int = 3
    # Nodes expanded per depth (the best by cumulative draft probability).
    beam: int = 4
    # Deepest draft (steps from the last committed token); None = as deep as the node budget.
    max_depth: int | None = 6
    # Fixed shape (costs None): a node off the spine (the head's own greedy chain) is kept only
    # if its cumulative draft probability reaches this. Why: the spine verifies on the cache
    # itself at almost no cost per row, but every other branch attends its own copy of the
    # cache (`Target.forward`); a branch the head gives little chance rarely pays for its copy.
    min_branch_prob: float = 0.0
    # Cost-shaped tree (costs given): each round keeps a node when its cumulative draft
    # probability (the chance that it is accepted: the head is calibrated, see docs/drafters.md) buys
    # at least as many tokens per unit of cost as the rounds so far did, for what the node adds
    # to the round's cost: a row, or a plane for the first node of a new branch. Drafting goes
    # one depth deeper while the kept nodes' probability at this depth, times `deeper_share`,
    # pays for a head step the same way. Tokens per unit of cost: a running mean over the
    # drafter's own rounds (a node pays when p / price >= tokens per unit of cost).
    costs: RoundCosts | None = None
    # Cost-shaped trees: the first node of a branch pays the plane for the whole branch, so
    # credit it with the drafts its branch is expected to add after it: p * (1 + continuation),
    # continuation = the running mean of accepted drafts after the first, over rounds that
    # accepted one. Off by default: on the 2-core CPU it bought tokens per forward but cost wall
    # time (reports/drafting/tree-shapes/); where a plane costs less, it may pay.
    branch_credit: bool = False
    # Share of a depth's probability expected to pay at the next depth (from a sweep of
    # simulated rounds on the built-in and Spec-Bench prompts: 0.3 was best on both).
    deeper_share: float = 0.3
    # Weight of the newest round in the running means (tokens per round, cost per round).
    feedback: float = 0.1

    def __post_init__(self) -> None:
        if self.width < 1 or self.beam < 1 or (self.max_depth is not None and self.max_depth < 1):
            raise InputError(f"TreeConfig needs width, beam and max_depth >= 1, got {self}.")
        if not 0.0 <= self.min_branch_prob <= 1.0:
            raise InputError(f"TreeConfig.min_branch_prob must be in [0, 1], got {self.min_branch_prob}.")
        if not 0.0 < self.deeper_share <= 1.0 or not 0.0 < self.feedback <= 1.0:
            raise InputError(f"TreeConfig.deeper_share and feedback must be in (0, 1], got {self.deeper_share} and "
                             f"{self.feedback}.")


# The tree that `build_drafter` makes for "tree" and "hybrid" (so `generate --tree`,
# `generate(tree=True)`, `bench --methods mtp-tree,hybrid` and `acceptance --tree` alike): at
# most 8 nodes and 6 deep, shaped each round by the costs (`RoundCosts`), and (hybrid) a
# prompt-lookup branch of up to 6. In simulated rounds over the head's own candidates (built-in
# and Spec-Bench prompts) it beat every fixed chain and the fixed tree (8 nodes, depth 4, floor
# 0.1) on both sets (reports/drafting/tree-shapes/). `FIXED_TREE` is that fixed tree.
TREE_NODES = 8
TREE_SHAPE = TreeConfig(costs=RoundCosts())
FIXED_TREE = TreeConfig(max_depth=4, min_branch_prob=0.1)
HYBRID_LOOKUP = 6
# What a round's parts cost where the target runs the fused forward (`fused.py`), measured on
# the same 2-core Xeon (bf16, 256-1,000 cached tokens). A branch costs no more than its rows
# there: tree rows attend their ancestors in place, so the plane is free. With these prices the
# tree kept more branches and accepted more per forward than with the op-by-op ones, and a
# dearer head step (0.1, not 0.05) bought wall time for little acceptance (reports/fused/fused-v2/).
FUSED_COSTS = RoundCosts(row=0.03, plane=0.0, step=0.1)


def tree_shape(engine: str, max_depth: int | None = TREE_SHAPE.max_depth, costs: RoundCosts | None = None) -> TreeConfig:
    """The cost-shaped tree for a target whose `Target.engine` is `engine`: priced by `costs` where
    given (this machine's, `head_round_costs`), else for the fused forward there, else for the
    op-by-op one (`RoundCosts` defaults)."""
    if costs is None:
        costs = FUSED_COSTS if engine == "fused" else TREE_SHAPE.costs
    return TreeConfig(max_depth=max_depth, costs=costs)


def head_round_costs(head: Any) -> RoundCosts | None:
    """This machine's measured prices (`measure.costs.machine_round_costs`, measured once and
    cached) where `head`'s target runs the fused forward on a GGUF file's blocks: a verify row
    costs there what dequantizing its weights costs, 0.03 of a one-token forward in FUSED_COSTS
    (dense weights) but 0.195 on the 2-core Xeon, where trees priced by FUSED_COSTS ran at
    0.96-0.99x k0 and trees priced by the measured costs at 1.16-1.17x
    (reports/drafting/tree-prices-gguf/). None elsewhere: the constants hold there."""
    if not isinstance(head, MTPHead) or head.target.engine != "fused" or not head.target.quantized:
        return None
    from ..measure.costs import machine_round_costs

    return machine_round_costs(head)


TREE_SHAPES = ("cost", "fixed")


def tree_config(shape: str, engine: str, max_depth: int | None = TREE_SHAPE.max_depth,
                floor: float = FIXED_TREE.min_branch_prob, costs: RoundCosts | None = None) -> TreeConfig:
    """The tree a `--tree-shape` names: "cost" (`tree_shape`: each round shaped by the costs of
    `engine` and the head's confidence) or "fixed" (the N best nodes; a node off the head's
    greedy spine only if its cumulative draft probability reaches `floor`). `costs`: this
    machine's prices for the cost-shaped tree (`head_round_costs`), else the constants."""
    if shape not in TREE_SHAPES:
        raise InputError(f"--tree-shape must be one of {', '.join(TREE_SHAPES)}, got {shape!r}.")
    if shape == "cost":
        return tree_shape(engine, max_depth, costs)
    return TreeConfig(max_depth=max_depth, min_branch_prob=floor)


@dataclass
class _Node:
    token: int
    parent: int  # index into the node list, -1 = the root
    score: float  # cumulative draft log-probability


def _as_draft(nodes: list[_Node]) -> Draft:
    return Draft(tokens=torch.tensor([n.token for n in nodes], dtype=torch.long),
                 parents=torch.tensor([n.parent for n in nodes], dtype=torch.long))


class TreeDrafter:
    """A draft tree of at most N nodes from an MTP head (deterministic: the same tree whether
    decoding greedily or sampling, given the same rounds before it). With `config.costs` the
    shape follows the costs and the head's confidence each round (`shaped_by_cost`), else it is
    the N best nodes (`ranked_nodes`, `shaped`)."""

    def __init__(self, head: MTPHead, config: TreeConfig | None = None):
        self.head = head
        self.config = config or TreeConfig()
        # Running means over this drafter's rounds (cost-shaped trees): tokens a round emitted,
        # and what it cost in one-token forwards; their ratio prices a node.
        self.tokens_per_round = 2.0
        self.cost_per_round = 1.2
        self.continuation = 0.5  # accepted drafts after the first, in rounds that accepted one (branch_credit)
        self._last: tuple[int, int, int] = (1, 1, 0)  # (verify rows, planes, head steps) of the last draft

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.head.hidden_layers

    def update(self, drafted: int, accepted: int) -> None:
        """Fold the last round into the running means (cost-shaped trees only)."""
        c, a = self.config.costs, self.config.feedback
        if c is None:
            return
        rows, planes, steps = self._last
        cost = 1.0 + c.row * (rows - 1) + c.plane * (planes - 1) + c.step * steps
        self.tokens_per_round += a * (accepted + 1 - self.tokens_per_round)
        self.cost_per_round += a * (cost - self.cost_per_round)
        if accepted >= 1:
            self.continuation += a * (accepted - 1 - self.continuation)

    def _root(self, inp: DraftInput) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor,
                                             torch.Tensor | None, torch.Tensor | None]:
        """What every depth of a round's tree reads: the target's cached keys and values at the
        head's layer (1, Hk, L, hd) each, zero copy; L; the root's head state (1, 1, D) and token
        (1, 1); this round's vocabulary (V'',) and extra LM-head rows (E, D)."""
        keys, values = inp.cache.layer(self.head.kv_layer)
        vocab, extra = self.head.round_vocab(inp.tokens, inp.memo)
        return keys, values, keys.shape[2], self.head.initial_state(inp.hidden[:, None]), inp.tokens[:, -1:], vocab, extra

    def _children(self, states: torch.Tensor, tokens: torch.Tensor, position: int, keys: torch.Tensor,
                  values: torch.Tensor, vocab: torch.Tensor | None, extra: torch.Tensor | None,
                  cache: KVCache) -> tuple[torch.Tensor, list[list[float]], list[list[int]]]:
        """One batched head step over the R frontier nodes (all at `position`): their next
        states (1, R, D), and the log-probabilities [R][W] and target ids [R][W] of each one's
        W most likely children (as lists: read one by one, a tensor element costs a call)."""
        head = self.head
        if (fast := head.fused_step()) is not None:  # the same step as one C call
            cos1, sin1 = head.round_rope(position, 1, states)  # (1, hd) each, sin signed
            states, logits = fast.step(states, tokens, cos1[0], sin1[0], cache, head.kv_layer, extra)
        else:
            cos, sin = head.rope(torch.full((1, tokens.shape[1]), position, device=states.device), states)  # (1, R, hd)
            states = head.step(states, tokens, cos, sin, keys, values, None)  # (1, R, D)
            logits = head.project(head.target.final_norm(states), extra)[0]  # (R, V'')
        logp = logits.float().log_softmax(-1)  # (R, V'')
        top = logp.topk(min(self.config.width, logp.shape[-1]), dim=-1)  # (R, W)
        ids = top.indices if vocab is None else vocab[top.indices]  # (R, W)
        return states, top.values.tolist(), ids.tolist()

    @torch.no_grad()
    def shaped_by_cost(self, inp: DraftInput, n: int) -> list[_Node]:
        """At most n nodes, depth by depth, each depth's best first (parents before children).
        A node is kept when its gain >= its price * value, value = tokens per unit of cost so
        far (so the node does not lower it). A node that continues a chain (its parent's first
        kept child): gain exp(score), price `row`. A node that starts a branch: gain exp(score)
        (times 1 + continuation with `branch_credit`), price `plane + row`. Drafting stops when no
        node of a depth was kept, or when the kept probability there times `deeper_share` is
        below `step * value`."""
        cfg = self.config
        costs = cfg.costs
        assert costs is not None
        value = self.tokens_per_round / self.cost_per_round
        keys, values, L, states, tokens, vocab, extra = self._root(inp)
        kept: list[_Node] = []
        tails = {-1}  # kept nodes no kept child continues yet (-1: the root, before the spine)
        planes, steps = 1, 0
        frontier = [-1]  # kept node ids to expand at this depth (-1 = the root)
        scores = [0.0]
        for depth in range(min(n, cfg.max_depth or n)):
            states, top, ids = self._children(states, tokens, L + depth, keys, values, vocab, extra, inp.cache)
            steps += 1
            cand = sorted(((scores[r] + lp, r, j) for r, row in enumerate(top) for j, lp in enumerate(row)), key=lambda c: -c[0])
            born: list[tuple[int, int]] = []  # (kept id, frontier row)
            for score, r, j in cand:
                if len(kept) == n:
                    break
                parent = frontier[r]
                starts_branch = parent not in tails
                price = costs.row + (costs.plane if starts_branch else 0.0)
                gain = math.exp(score) * (1.0 + self.continuation if starts_branch and cfg.branch_credit else 1.0)
                if gain < price * value:
                    continue
                kept.append(_Node(ids[r][j], parent, score))
                tails.discard(parent)
                tails.add(len(kept) - 1)
                planes += starts_branch
                born.append((len(kept) - 1, r))
            mass = sum(math.exp(kept[b].score) for b, _ in born)
            if not born or len(kept) == n or mass * cfg.deeper_share < costs.step * value:
                break
            best = born[: cfg.beam]  # already best first
            frontier = [b for b, _ in best]
            states = states[:, torch.tensor([r for _, r in best], device=states.device)]
            tokens = torch.tensor([[kept[b].token for b in frontier]], device=states.device)
            scores = [kept[b].score for b in frontier]
        self._last = (len(kept) + 1, planes, steps)
        return kept

    @torch.no_grad()
    def ranked_nodes(self, inp: DraftInput, n: int) -> list[_Node]:
        """Candidate nodes, best first; every prefix of the list holds its nodes' ancestors."""
        cfg = self.config
        keys, values, L, states, tokens, vocab, extra = self._root(inp)
        nodes: list[_Node] = []
        frontier = [-1]  # node ids to expand at this depth (-1 = the root)
        scores = [0.0]
        for depth in range(min(n, cfg.max_depth or n)):
            states, top, ids = self._children(states, tokens, L + depth, keys, values, vocab, extra, inp.cache)
            born = []
            for r, row in enumerate(top):
                for j, lp in enumerate(row):
                    nodes.append(_Node(ids[r][j], frontier[r], scores[r] + lp))
                    born.append((len(nodes) - 1, r))
            # expand the best `beam` of the new nodes at the next depth
            best = sorted(born, key=lambda b: -nodes[b[0]].score)[: cfg.beam]
            frontier = [b for b, _ in best]
            rows = torch.tensor([r for _, r in best], device=states.device)
            states = states[:, rows]
            tokens = torch.tensor([[nodes[b].token for b in frontier]], device=states.device)
            scores = [nodes[b].score for b in frontier]
        # best first; a stable sort keeps a parent (created earlier, score >= child's) ahead
        order = sorted(range(len(nodes)), key=lambda i: -nodes[i].score)
        remap = {-1: -1}
        ranked = []
        for i in order:
            if nodes[i].parent not in remap:  # an equal-score child before its parent: skip
                continue
            remap[i] = len(ranked)
            ranked.append(_Node(nodes[i].token, remap[nodes[i].parent], nodes[i].score))
        return ranked

    def nodes(self, inp: DraftInput, k: int) -> list[_Node]:
        """This round's tree: at most k nodes, parents before children."""
        if self.config.costs is not None:
            return self.shaped_by_cost(inp, k)
        return self.shaped(self.ranked_nodes(inp, k), k)

    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        return _as_draft(self.nodes(inp, k))

    def shaped(self, ranked: list[_Node], k: int) -> list[_Node]:
        """At most k of the ranked nodes, best first: every spine node (the greedy chain: each
        depth's first-ranked child of the previous spine node), and the others whose cumulative
        draft probability reaches `min_branch_prob`. Parents stay before their children."""
        if self.config.min_branch_prob <= 0.0:
            return ranked[:k]
        floor = math.log(self.config.min_branch_prob)
        spine, tip = set(), -1
        for i, n in enumerate(ranked):
            if n.parent == tip:
                spine.add(i)
                tip = i
        remap = {-1: -1}
        out: list[_Node] = []
        for i, n in enumerate(ranked):
            if len(out) == k:
                break
            if (i in spine or n.score >= floor) and n.parent in remap:
                remap[i] = len(out)
                out.append(_Node(n.token, remap[n.parent], n.score))
        return out


def lookup(tokens: list[int], max_tokens: int, max_ngram: int = 3) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the text's last
    n-gram (n = max_ngram down to 1), at most max_tokens; [] when nothing matches."""
    T = len(tokens)
    for n in range(min(max_ngram, T - 1), 0, -1):
        tail = tokens[T - n:]
        for s in range(T - n - 1, -1, -1):  # latest match first, never the tail itself
            if tokens[s:s + n] == tail:
                return tokens[s + n: s + n + max_tokens]
    return []


class LookupDrafter:
    """Prompt-lookup drafts in mtpspec's loop (a chain of at most k tokens; no model)."""

    hidden_layers = (-1,)

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def update(self, drafted: int, accepted: int) -> None:
        """Lookup has nothing to adapt."""

    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        cont = lookup(inp.tokens[0].tolist(), k, self.max_ngram)
        return Draft(tokens=torch.tensor(cont, dtype=torch.long))


class ChainNodes:
    """Any chain drafter's greedy chain as tree nodes (`HybridDrafter` merges them with the
    lookup branch): for drafters that propose chains only, such as a Gemma 4 assistant. The
    nodes are proposed greedily whatever the sampling, so they are verified as point masses."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.drafter.hidden_layers

    def update(self, drafted: int, accepted: int) -> None:
        self.drafter.update(drafted, accepted)

    def nodes(self, inp: DraftInput, k: int) -> list[_Node]:
        chain = self.drafter.propose(inp, k, SamplingConfig(), None).tokens.tolist() if k > 0 else []
        return [_Node(int(t), i - 1, 0.0) for i, t in enumerate(chain)]


class HybridDrafter:
    """The head's tree (or another drafter's chain, `ChainNodes`) with a prompt-lookup branch
    merged in, N nodes in all, one verify pass.

    The lookup branch goes in first (up to `lookup_tokens` nodes), then the head's nodes best
    first; a node that repeats an existing (parent, token) pair is merged, not duplicated."""

    def __init__(self, head: MTPHead | Drafter, config: TreeConfig | None = None, lookup_tokens: int = 4,
                 max_ngram: int = 3):
        self.tree: TreeDrafter | ChainNodes = TreeDrafter(head, config) if isinstance(head, MTPHead) else ChainNodes(head)
        self.lookup_tokens = lookup_tokens
        self.max_ngram = max_ngram
        self.last_branch = 0  # lookup nodes in the last draft (for per-round reporting)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.tree.hidden_layers

    def update(self, drafted: int, accepted: int) -> None:
        """The tree's running means count the hybrid's rounds (what a unit of cost buys)."""
        self.tree.update(drafted, accepted)

    @torch.no_grad()
    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        branch = lookup(inp.tokens[0].tolist(), min(self.lookup_tokens, k), self.max_ngram)
        nodes: list[_Node] = []
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        parent = -1
        for tok in branch:
            nodes.append(_Node(tok, parent, 0.0))
            parent = index[(parent, tok)] = len(nodes) - 1
        self.last_branch = len(nodes)
        remap = {-1: -1}
        for i, c in enumerate(self.tree.nodes(inp, k)):
            if len(nodes) == k:
                break
            key = (remap[c.parent], c.token)
            if key not in index:
                nodes.append(_Node(c.token, key[0], c.score))
                index[key] = len(nodes) - 1
            remap[i] = index[key]
        return _as_draft(nodes)


# default longest lookup draft of a switch round: a verify of up to 6 rows (fused.c's NRMAX) reads
# each weight once; a 7th row makes a quantized block be read again
SWITCH_TOKENS = 5


class SwitchDrafter:
    """Each round one chain, whichever is cheaper to have: the prompt-lookup continuation (up to
    `lookup_tokens`, None: k) when the text so far repeats its last n-gram and at least
    `min_lookup` tokens follow, else the head's own chain of `head_tokens` (None: k; 0: no head
    drafts, lookup rounds only). Never more than the round's k. Greedy output is plain
    decoding's; sampled lookup drafts carry no q and are verified as point masses (exact)."""

    def __init__(self, head: MTPHead | Drafter, head_tokens: int | None = None, min_lookup: int = 2, max_ngram: int = 3,
                 lookup_tokens: int | None = None):
        if min_lookup < 1 or max_ngram < 1 or (head_tokens is not None and head_tokens < 0) or \
                (lookup_tokens is not None and lookup_tokens < 1):
            raise InputError(f"SwitchDrafter needs min_lookup, max_ngram and lookup_tokens >= 1 and head_tokens >= 0, "
                             f"got {min_lookup}, {max_ngram}, {lookup_tokens} and {head_tokens}.")
        self.head = head
        self.head_tokens = head_tokens
        self.lookup_tokens = lookup_tokens
        self.min_lookup = min_lookup
        self.max_ngram = max_ngram
        self.last = "head"  # which drafter proposed the last round: "lookup" or "head"

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.head.hidden_layers

    def update(self, drafted: int, accepted: int) -> None:
        if self.last == "head":
            self.head.update(drafted, accepted)

    @torch.no_grad()
    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        cont = lookup(inp.tokens[0].tolist(), min(k, self.lookup_tokens or k), self.max_ngram)
        if len(cont) >= self.min_lookup:
            self.last = "lookup"
            return Draft(tokens=torch.tensor(cont, dtype=torch.long))
        self.last = "head"
        n = min(k, k if self.head_tokens is None else self.head_tokens)
        if n == 0:
            return Draft(tokens=torch.zeros(0, dtype=torch.long))
        return self.head.propose(inp, n, sampling, generator)


# -- one place where words become a drafter ----------------------------------------------------
DRAFTER_KINDS = ("chain", "tree", "hybrid", "switch", "lookup")
# Drafts per round for a head that records no measured k: a safe middle of the k sweep.
FALLBACK_K = 3


def default_k(head: Any) -> int:
    """The head's own drafts per round: the k measured best for it (saved as `recommended_k`,
    either one int or one per dtype, e.g. {"float32": 4, "bfloat16": 2, "q8": 1}: the cost of verifying
    k + 1 tokens depends on the dtype's kernels), else FALLBACK_K.

    A recorded 0 means no k measured faster than plain decoding for that dtype: plain decoding
    it is (the output is the same either way)."""
    rec = getattr(head, "recommended_k", None)
    if isinstance(rec, dict):
        target = getattr(head, "target", None)
        dtype = target.dtype_name if isinstance(target, Target) else str(next(head.parameters()).dtype).removeprefix("torch.")
        rec = rec.get(dtype)
    return FALLBACK_K if rec is None else int(rec)


def build_drafter(head: MTPHead | Drafter | None, kind: str = "chain", *, k: int | None = None,
                  head_k: int | None = None, tree: TreeConfig | None = None,
                  lookup_tokens: int | None = None) -> tuple[Drafter | None, int]:
    """The drafter `kind` names, built on `head`, and the k to run it with (`step`'s
    num_draft_tokens). The CLI, the server, the bench and `generate` all build drafters here, so
    the same words build the same drafter everywhere.

    kind:
      "chain"  the head's own chain of k (`head` may be any Drafter; None = plain decoding)
      "tree"   a tree of at most k nodes from the head, shaped by `tree`
      "hybrid" that tree with a prompt-lookup branch of up to `lookup_tokens` merged in (from a
               chain Drafter that is not an MTP head, e.g. a Gemma 4 assistant: its greedy chain)
      "switch" each round the prompt-lookup continuation of up to k tokens when the text repeats,
               else the head's chain of `head_k`; the round's k is the longer of the two (`head`
               may be any chain Drafter, e.g. a Gemma 4 assistant)
      "lookup" prompt lookup alone, up to k tokens (no head)
    Defaults, declared here once: k None is the head's own k (`default_k`) for a chain,
    TREE_NODES for a tree or hybrid, SWITCH_TOKENS for a lookup; `head_k` None is the head's own
    k; `tree` None is the cost-shaped tree priced for the head's target (`tree_shape`);
    `lookup_tokens` None is HYBRID_LOOKUP."""
    if kind not in DRAFTER_KINDS:
        raise InputError(f"Unknown drafter {kind!r}; choose from {', '.join(DRAFTER_KINDS)}.")
    if kind == "lookup":
        return LookupDrafter(), SWITCH_TOKENS if k is None else k
    if head is not None and not isinstance(head, Drafter):
        raise InputError(f"{type(head).__name__} is not a Drafter: it needs `hidden_layers`, `propose()` and "
                         "`update()` (see mtpspec.core.draft.Drafter).")
    if kind == "chain":
        if head is None:
            return None, 0 if k is None else k
        return head, default_k(head) if k is None else k
    if not isinstance(head, MTPHead) and (kind == "tree" or head is None):
        raise InputError(f"A {kind} drafter is built from an MTPHead, not {type(head).__name__}: a tree needs the "
                         "head's distributions (a chain drafter such as a Gemma 4 assistant drafts chains, "
                         "switch and hybrid rounds).")
    if kind == "switch":  # any chain drafter: an MTP head, a Gemma 4 assistant
        chain = default_k(head) if head_k is None else head_k
        longest = SWITCH_TOKENS if k is None else k
        return SwitchDrafter(head, head_tokens=chain, lookup_tokens=longest), max(longest, chain)
    nodes = TREE_NODES if k is None else k
    lookup_n = HYBRID_LOOKUP if lookup_tokens is None else lookup_tokens
    if not isinstance(head, MTPHead):  # hybrid: another drafter's greedy chain beside the lookup branch
        return HybridDrafter(head, lookup_tokens=lookup_n), nodes  # type: ignore[arg-type]
    shape = tree if tree is not None else tree_shape(head.target.engine, costs=head_round_costs(head))
    if kind == "tree":
        return TreeDrafter(head, shape), nodes
    return HybridDrafter(head, shape, lookup_tokens=lookup_n), nodes
