"""What a round costs on this hardware, and the draft length that pays best.

A round with k drafts costs k head steps plus one target forward over k + 1 tokens, and
yields on average 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens, where a_i is the head's
conditional acceptance rate at draft position i. The best k maximises tokens per second:

    speedup(k) = E[tokens | k] / (verify(k + 1) / verify(1) + k * draft_step / verify(1))

Everything here is measured (median of repeated timings), never assumed. Beside it, the physical
limit: the bytes of weights a forward reads over this machine's memory bandwidth (`bandwidth.py`).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import SamplingConfig
from ..core.draft import DraftInput
from ..core.drafters import FIXED_TREE, RoundCosts, TreeDrafter
from ..core.head import MTPHead
from ..core.target import Target
from ..core.tree import positions, tree_mask
from ..errors import InputError
from .bandwidth import MemoryLimit, forward_bytes, forward_matrices, measure_bandwidth


@dataclass(frozen=True)
class Costs:
    context: int  # cached positions when timing
    verify_s: dict[int, float]  # n new tokens -> seconds for one target forward
    draft_step_s: float  # one head step (all its blocks + its LM-head projection)
    dtype: str
    draft_vocab: int  # rows of the head's output projection
    # A tree verify: a spine of TREE_SPINE rows plus TREE_BRANCHES siblings at depth 1 (each its
    # own plane), and one depth of tree drafting (a batched step of the head over its beam);
    # None when max_n is too small for the tree.
    tree_verify_s: float | None = None
    tree_step_s: float | None = None
    # The one-token forward beside its bandwidth limit; None when the bandwidth was not measured.
    memory: MemoryLimit | None = None

    def relative(self, n: int) -> float:
        return self.verify_s[n] / self.verify_s[1]

    def round_costs(self) -> RoundCosts | None:
        """The cost-shaped tree's prices on this machine, as fractions of a one-token forward."""
        n = TREE_SPINE + TREE_BRANCHES + 1  # verify rows of the timed tree
        if self.tree_verify_s is None or self.tree_step_s is None or n not in self.verify_s:
            return None
        v1, top = self.verify_s[1], max(self.verify_s)
        return RoundCosts(row=max(0.0, (self.verify_s[top] - v1) / (top - 1) / v1),
                          plane=max(0.0, (self.tree_verify_s - self.verify_s[n]) / TREE_BRANCHES / v1),
                          step=self.tree_step_s / v1)


TREE_SPINE, TREE_BRANCHES = 4, 3


def median_time(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of `reps` calls of fn, after one untimed call."""
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


@torch.no_grad()
def measure_costs(target: Target, head: Any, max_n: int = 9, context: int = 256, reps: int = 15,
                  bandwidth_bytes: int = 0) -> Costs:
    """Time one target forward over n = 1..max_n new tokens after `context` cached tokens,
    and one draft step of `head` (an MTP head, or any chain Drafter such as a Gemma 4 assistant;
    the tree's timings for an MTP head only), on this machine; with bandwidth_bytes > 0, also
    stream a buffer of that size to measure the memory bandwidth, and set the one-token forward
    beside its limit."""
    if bandwidth_bytes < 0:
        raise InputError(f"--bandwidth-mib must be >= 0 (0 = skip the bandwidth), got {bandwidth_bytes // 2**20}.")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (1, context + max_n), generator=g)
    # sized as decoding sizes it (attention spans every slot, so the capacity is part of the cost)
    cache = target.new_cache(context + max_n)
    pre = target.forward(ids[:, :context], cache, head.hidden_layers, logits_to_keep=1)
    verify = {}
    for n in range(1, max_n + 1):
        def run(n: int = n) -> None:
            target.forward(ids[:, context:context + n], cache, head.hidden_layers)
            cache.truncate(context)  # drop the n rows again, as a round that rejects them
        verify[n] = median_time(run, reps)
    tree_s = tree_step = None
    if TREE_SPINE + TREE_BRANCHES + 1 <= max_n and isinstance(head, MTPHead):  # trees come from an MTP head
        parents = list(range(-1, TREE_SPINE - 1)) + [-1] * TREE_BRANCHES
        pos, mask = positions(parents, context), tree_mask(parents)

        def run_tree() -> None:
            target.forward(ids[:, context:context + len(parents) + 1], cache, head.hidden_layers,
                           positions=pos, tree_mask=mask)
            cache.truncate(context)
        tree_s = median_time(run_tree, reps)
    inp = DraftInput(tokens=ids[:, :context + 1], hidden=pre.hidden[:, -1], cache=cache)
    k = 4
    step = median_time(lambda: head.propose(inp, k, SamplingConfig(), None), reps) / k
    if tree_s is not None:
        tree = TreeDrafter(head, FIXED_TREE)  # width 3, beam 4: every depth a batched step
        tree_step = median_time(lambda: tree.ranked_nodes(inp, k), reps) / k
    draft_ids = getattr(head, "draft_ids", None)  # an MTP head's reduced draft vocabulary
    vocab = draft_ids.numel() if draft_ids is not None else target.vocab_size
    memory = None
    if bandwidth_bytes > 0:
        memory = MemoryLimit(weight_bytes=forward_bytes(forward_matrices(target)),
                             bandwidth=measure_bandwidth(bandwidth_bytes), forward_s=verify[1])
    return Costs(context=context, verify_s=verify, draft_step_s=step, dtype=target.dtype_name,
                 draft_vocab=vocab, tree_verify_s=tree_s, tree_step_s=tree_step, memory=memory)


def machine_round_costs(head: MTPHead, reps: int = 9) -> RoundCosts:
    """The cost-shaped tree's prices for `head` and its target on this machine (`Costs.round_costs`:
    a verify row, a branch's plane, a draft step, as fractions of a one-token forward), measured
    once and kept in the cache folder (`MTPSPEC_CACHE`), keyed by the CPU, torch, threads, dtype,
    the fused kernels' AMX setting, the target and the head. Where the target computes on a GGUF
    file's blocks, a verify row costs what dequantizing its weights costs, which differs from
    CPU to CPU (0.19 of a one-token forward on a 2-core Xeon, about 0.08 on an EPYC Zen 4), so
    no constant prices both (reports/drafting/tree-prices-gguf/)."""
    from ..core import fused, native

    target = head.target
    ident = {"cpu": native.cpuinfo("model name"), "torch": torch.__version__, "threads": torch.get_num_threads(),
             "dtype": str(target.dtype), "amx": fused.uses_amx(), "engine": target.engine,
             "quantized": target.quantized, "target": target.identity().__dict__,
             "head": {**head.config.to_dict(), "draft_vocab": int(head.draft_ids.numel()) if head.draft_ids is not None else 0}}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    path = native.cache_dir() / f"round-costs-{key}.json"
    try:
        return RoundCosts(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass  # not measured yet here, or a stale or damaged file: measure
    costs = measure_costs(target, head, max_n=TREE_SPINE + TREE_BRANCHES + 1, reps=reps).round_costs()
    assert costs is not None  # max_n covers the timed tree
    native.save_measured(path, asdict(costs))
    return costs


def expected_tokens(position_acceptance: list[float], k: int) -> float:
    """1 + sum_i prod_{j<=i} a_j over the first k positions (a_j: conditional rates)."""
    total, run = 1.0, 1.0
    for a in position_acceptance[:k]:
        run *= a
        total += run
    return total


def predicted_speedup(costs: Costs, position_acceptance: list[float], k: int) -> float:
    cost = costs.relative(k + 1) + k * costs.draft_step_s / costs.verify_s[1]
    return expected_tokens(position_acceptance, k) / cost


def predicted_speedups(costs: Costs, position_acceptance: list[float]) -> dict[int, float]:
    """k -> predicted speed-up, for k in 1..len(position_acceptance) within the measured costs."""
    return {k: predicted_speedup(costs, position_acceptance, k)
            for k in range(1, len(position_acceptance) + 1) if k + 1 in costs.verify_s}


def pick_k(costs: Costs, position_acceptance: list[float]) -> int:
    """The k with the best predicted speed-up; 0 if no k beats plain decoding."""
    speedups = predicted_speedups(costs, position_acceptance)
    best = max(speedups, key=speedups.__getitem__, default=0)
    return best if best and speedups[best] > 1.0 else 0


def position_rates(acceptance_rows: list[dict]) -> list[float]:
    """Greedy conditional acceptance per draft position, from `mtpspec acceptance --out` rows:
    the all-categories row with the largest k. Tree rows (`acceptance --tree`) count per depth, not
    per chain position, and are not used."""
    rows = [r for r in acceptance_rows if r.get("category") == "all" and float(r.get("temperature", 0)) == 0.0]
    chains = [r for r in rows if r.get("drafter", "chain") == "chain"]
    if rows and not chains:
        raise InputError("The acceptance file holds tree rows only (`mtpspec acceptance --tree`); the costs pick a "
                         "chain's k: write the file without --tree.")
    rows = chains
    if not rows:
        raise InputError("The acceptance file has no greedy all-categories row; write it with "
                         "`mtpspec acceptance --temperatures 0 --out FILE`.")
    try:
        return [float(a) for a in max(rows, key=lambda r: int(r["k"]))["position_acceptance"]]
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"An acceptance row lacks a usable k or position_acceptance ({e!r}); write the file with "
                         "`mtpspec acceptance --out FILE`.") from None


def read_position_rates(path: str | Path) -> list[float]:
    """`position_rates` of a file written by `mtpspec acceptance --out`."""
    p = Path(path)
    try:
        rows = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p} does not exist; write it with `mtpspec acceptance --out FILE`.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{p} is not valid JSON ({e}); write it with `mtpspec acceptance --out FILE`.") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"{p} is not a list of acceptance rows; write it with `mtpspec acceptance --out FILE`.")
    return position_rates(rows)
