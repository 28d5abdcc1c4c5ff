"""Continuous batching: the rounds of many requests in one target forward, each request's output
exactly what it would be decoded alone.

A `Batch` holds requests (`Slot`s) that join at any time and leave when done or removed. Each
`Batch.step` is one target forward (`Target.forward_many`) over the verify rows of the running
requests (their last token and drafts) and chunks of the prompts still being prefilled; each
request attends only its own cache. The MTP head drafts for every running request in one fused
call per draft depth (`MTPHead.propose_many`). A request that joins copies, instead of prefilling,
the longest prefix of its prompt that a running request or a recently finished one
(`BatchConfig.prefix_keep`) holds in its cache: those slots are what its own prefill would write.

Why the outputs do not depend on the company: the fused forward computes every row on its own
(row invariance, `fused.c`), so a request's rows give, bit for bit, what its own verify pass or
prefill gives alone, and a prompt prefilled in chunks gives what it gives in one piece. Every
request keeps its own generator, drafter and acceptance rule. Its drafts per round follow the
load (`BatchConfig.draft_rows`: fewer drafts when many requests share a forward), which changes
no greedy output; a request sampled with a seed keeps its own k (when rows run short, whole
requests wait a step instead, round robin), so it draws the same numbers in the same order as
alone. The rows of one forward
are capped (`BatchConfig.max_rows`, checked bit for bit by the tests); on a target that runs op
by op (the torch engine) the sequences run one after another and prompts are not cut.

Letters: R rows of one forward, k drafts of a request's round.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..config import AcceptanceConfig, SamplingConfig
from ..errors import InputError
from .cache import KVCache
from .decode import DecodeState, Round, Verify, conclude, finish_prefill, open_state, prepare, round_k
from .draft import Drafter, DraftInput
from .fused import SeqRows
from .sampling import probs_from_logits
from .target import Target, TargetStep

# Rows of one batched forward that the tests check bit for bit against one sequence alone.
BATCH_ROWS_MAX = 64
# BatchConfig.draft_rows where quantized matrices run on AMX tiles (`fused.amx_blocks`), where
# rows cost little: reports/batching/draft_rows.py (2-core Xeon, 8 requests over the built-in
# prompts, 96 tokens, k = 3 at most) gave 328 tok/s with 6 (no drafts), 374 with 16, 373 with
# 24, 370 with 32 (an earlier run: 346 / 391 / 402 / 384); on AVX-512 6 stays best.
AMX_DRAFT_ROWS = 24
# Rows of one forward where quantized matrices run on AMX tiles: the most the tests check. On a
# 2-core Xeon with AMX (2026-12-07, `load_test.py --rounds 3`, two alternating pairs), 64 against
# 48 gave 8 streams 3.87 / 3.83x one stream against 3.63 / 3.78x, and TTFT p50 61-64 ms against
# 77 ms: 8 prompts joining at once fit fewer steps.
AMX_MAX_ROWS = BATCH_ROWS_MAX


@dataclass(frozen=True)
class BatchConfig:
    # The most rows one target forward runs: the running requests' verify rows (k + 1 each)
    # plus prompt chunks. At most BATCH_ROWS_MAX.
    max_rows: int = 48
    # Prompt rows a forward reserves while a prompt waits (the rest of max_rows goes to running
    # requests; prompts also take whatever rows they leave).
    prefill_rows: int = 16
    # Draft rows the running requests share per forward (None: each drafts its own k always):
    # with n running, a request drafts min(k, draft_rows // n - 1) (never below 0): k = 3 for
    # one or two requests, 1 for three, none from four on (in-process sweep, SmolLM2 on 2 cores:
    # four requests 330-346 tok/s with none, 305 with one draft each, 277 with two). On a CPU an
    # extra row costs arithmetic, so drafts that pay for one request cost throughput for many.
    # Greedy output is the same whatever k is, and unseeded sampling keeps the target's law; a
    # request sampled with a seed always drafts its own k, so that its draws do not depend on
    # the load.
    draft_rows: int | None = 6
    # Prompt prefixes computed once: a request that joins copies the keys and values of the
    # longest prefix its prompt shares with a running request's committed text or with one of
    # the last `prefix_keep` finished requests' (their caches are kept that long; 0 keeps none,
    # running requests are still read), and prefills only the rest. Exact on the fused engine,
    # which computes every row on its own over the slots it is given: the copied slots are the
    # ones the request's own prefill would write (the torch engine never copies). Memory: a
    # kept cache is the finished request's own (prompt + max_new_tokens slots).
    prefix_keep: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.max_rows <= BATCH_ROWS_MAX:
            raise InputError(f"max_rows must be in 1..{BATCH_ROWS_MAX} (the rows per forward checked bit for bit), "
                             f"got {self.max_rows}.")
        if not 1 <= self.prefill_rows <= self.max_rows:
            raise InputError(f"prefill_rows must be in 1..max_rows ({self.max_rows}), got {self.prefill_rows}.")
        if self.prefix_keep < 0:
            raise InputError(f"prefix_keep must be >= 0 (0: keep no finished request's cache), got {self.prefix_keep}.")
        if self.draft_rows is not None and self.draft_rows < 1:
            raise InputError(f"draft_rows must be >= 1 (or None: no load-dependent k), got {self.draft_rows}.")


@dataclass(eq=False)
class Slot:
    """One request in a batch: its decode state, its own drafter and k; `prefilled` prompt rows
    are in its cache (the prompt is done when it equals the prompt length)."""

    state: DecodeState
    drafter: Drafter | None
    k: int
    prefilled: int = 0
    joined_s: float = field(default_factory=time.perf_counter)

    @property
    def running(self) -> bool:
        """Prefilled and not done: it takes part in decode rounds."""
        return self.prefilled == self.state.prompt_length and not self.state.done

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def fixed_k(self) -> bool:
        """Sampled with a seed: its k never follows the load (its draws would)."""
        return not self.state.sampling.greedy and self.state.sampling.seed is not None

    def round_k(self, share: int | None) -> int:
        """Drafts this round: its k, capped by `share` (the load's) unless fixed, and by max_new_tokens."""
        k = self.k if share is None or self.fixed_k else min(self.k, share)
        return round_k(self.state, self.drafter, k)


class Batch:
    """Requests decoded together, one target forward per `step` (see the module's docstring).
    Not thread-safe: one owner calls `add`, `remove` and `step`."""

    def __init__(self, target: Target, config: BatchConfig | None = None):
        self.target = target
        self.config = config or BatchConfig()
        self.slots: list[Slot] = []  # in arrival order
        self._turn = 0  # round robin: the running request that goes first next step
        self.rows_last = 0  # rows of the last step's forward
        # Finished requests' committed ids and caches, newest last (BatchConfig.prefix_keep)
        self._kept: deque[tuple[list[int], KVCache]] = deque(maxlen=self.config.prefix_keep or None)
        self.reused_tokens = 0  # prompt positions copied instead of prefilled, over the batch's life

    def add(self, input_ids: torch.Tensor, max_new_tokens: int = 128, drafter: Drafter | None = None, k: int = 0,
            sampling: SamplingConfig | None = None, eos_token_id: int | Sequence[int] | None = None,
            acceptance: AcceptanceConfig | str | None = None) -> Slot:
        """A request joins: checked and given its own cache now, prefilled by the next steps.
        `drafter` is the request's own (a stateless one such as an `MTPHead` may be shared;
        one that adapts per round, a tree or switch drafter, should be built per request)."""
        if drafter is None:
            k = 0
        if k + 1 > self.config.max_rows:
            raise InputError(f"a round of k = {k} needs {k + 1} rows; this batch runs at most {self.config.max_rows} per forward.")
        layers = drafter.hidden_layers if drafter is not None and k > 0 else (-1,)
        state = open_state(self.target, input_ids, max_new_tokens, layers, sampling, eos_token_id, k, acceptance)
        round_k(state, drafter, k)  # refuses a k the kernels were not checked for, before the request joins
        slot = Slot(state=state, drafter=drafter, k=k)
        if self.target.engine == "fused":
            self._reuse_prefix(slot)
        self.slots.append(slot)
        return slot

    def remove(self, slot: Slot) -> None:
        """A request leaves (done, or cancelled): its cache is freed with it, or kept for its
        prefix (`BatchConfig.prefix_keep`)."""
        self.slots.remove(slot)
        if self.config.prefix_keep and slot.state.cache.length:
            self._kept.append((_committed(slot), slot.state.cache))

    def _reuse_prefix(self, slot: Slot) -> None:
        """Copy into the new request's cache the longest prefix of its prompt (all but its last
        id, whose row gives the first token) that a running request or a kept finished one has
        committed, newest first; the batch then prefills only the rest."""
        prompt = slot.state.tokens[0].tolist()
        best, source = 0, None
        candidates = [(_committed(s), s.state.cache) for s in reversed(self.slots)] + list(reversed(self._kept))
        for ids, cache in candidates:
            n = _shared_prefix(prompt, ids)
            if n > best:
                best, source = n, cache
        n = min(best, len(prompt) - 1)
        if n > 0 and source is not None:
            slot.state.cache.copy_prefix(source, n)
            slot.prefilled = n
            self.reused_tokens += n

    def __len__(self) -> int:
        return len(self.slots)

    @torch.no_grad()
    def step(self) -> list[tuple[Slot, Round]]:
        """One target forward for as many requests as its rows allow: each running request chosen
        gets one round (draft, verify, accept), each prompt chosen a chunk. Returns the rounds
        emitted, in slot order: a prefilled request's first token arrives as its first round."""
        cfg = self.config
        t0 = time.perf_counter()
        running = [s for s in self.slots if s.running]
        waiting = [s for s in self.slots if s.prefilled < s.state.prompt_length]
        # 1. Choose the running requests, round robin, while their rows fit
        budget = cfg.max_rows - (cfg.prefill_rows if waiting else 0)
        order = running[self._turn % len(running):] + running[: self._turn % len(running)] if running else []
        share = None if cfg.draft_rows is None or not running else max(cfg.draft_rows // len(running) - 1, 0)
        chosen: list[tuple[Slot, int]] = []
        used = 0
        for s in order:
            k = s.round_k(share)
            if used + k + 1 > budget and chosen:
                continue
            chosen.append((s, k))
            used += k + 1
        self._turn += len(chosen)
        # 2. Prompt chunks in arrival order, with the rows left (a target run op by op: whole prompts)
        fused = bool(waiting) and self.target.engine == "fused"
        chunks: list[tuple[Slot, int]] = []
        left = max(cfg.max_rows - used, 0)
        for s in waiting:
            rest = s.state.prompt_length - s.prefilled
            n = min(rest, left) if fused else rest
            if n <= 0 or (not fused and chunks):
                break
            chunks.append((s, n))
            left -= n
        # 3. Draft: the MTP heads' chains for all their requests at once, the others one by one
        verifies = self._draft(chosen)
        t1 = time.perf_counter()
        # 4. One forward over every sequence's rows (grouped by the features their drafters read)
        seqs: list[tuple[Slot, SeqRows]] = [(s, SeqRows(v.rows, s.state.cache, layout=v.layout)) for (s, _), v in
                                            zip(chosen, verifies)]
        seqs += [(s, SeqRows(s.state.tokens[:, s.prefilled:s.prefilled + n], s.state.cache, logits_to_keep=1))
                 for s, n in chunks]
        self.rows_last = sum(int(sq.input_ids.shape[1]) for _, sq in seqs)
        outs = {}
        for layers in dict.fromkeys(s.state.hidden_layers for s, _ in seqs):
            group = [(s, sq) for s, sq in seqs if s.state.hidden_layers == layers]
            for (s, _), out in zip(group, self.target.forward_many([sq for _, sq in group], layers)):
                outs[id(s)] = out
        t2 = time.perf_counter()
        # 5. Accept and roll back per request; finished prompts pick their first token
        emitted: dict[int, Round] = {}
        laws = self._laws([s for s, _ in chosen], outs)
        for (s, _), v in zip(chosen, verifies):
            emitted[id(s)] = conclude(s.state, s.drafter, v, outs[id(s)], t1 - t0, t2 - t1, laws.get(id(s)))
        for s, n in chunks:
            s.prefilled += n
            if s.prefilled == s.state.prompt_length:
                emitted[id(s)] = finish_prefill(s.state, outs[id(s)])
                s.state.stats.prefill_s = time.perf_counter() - s.joined_s
            else:
                s.state.stats.target_forwards += 1
        return [(s, emitted[id(s)]) for s in self.slots if id(s) in emitted]

    @staticmethod
    def _laws(slots: list[Slot], outs: dict[int, TargetStep]) -> dict[int, torch.Tensor]:
        """The target's law over each sampled request's verify rows, computed for all requests
        with the same temperature / top-k / top-p in one call (each row as it is alone: the
        top-p sort, softmax and sum run per row; 34 rows 78 ms at once against 139 ms one by
        one, 2 cores)."""
        groups: dict[tuple, list[Slot]] = {}
        for s in slots:
            c = s.state.sampling
            if not c.greedy:
                groups.setdefault((c.temperature, c.top_k, c.top_p), []).append(s)
        laws: dict[int, torch.Tensor] = {}
        for group in groups.values():
            logits = [outs[id(s)].logits[0] for s in group]  # (M_s, V) each
            p = probs_from_logits(torch.cat(logits), group[0].state.sampling)
            for s, part in zip(group, p.split([lg.shape[0] for lg in logits])):
                laws[id(s)] = part
        return laws

    def _draft(self, chosen: list[tuple[Slot, int]]) -> list[Verify]:
        """Each chosen request's round, drafted: requests whose drafter has `propose_many` (an MTP
        head's chain) draft together, one call per drafter; the others one by one."""
        drafts: dict[int, object] = {}
        together: dict[int, list[tuple[Slot, int]]] = {}
        for s, k in chosen:
            if k > 0 and hasattr(s.drafter, "propose_many"):
                together.setdefault(id(s.drafter), []).append((s, k))
        for group in together.values():
            drafter = group[0][0].drafter
            got = drafter.propose_many([DraftInput(s.state.tokens, s.state.hidden, s.state.cache, s.state.draft_memo)
                                        for s, _ in group],  # type: ignore[union-attr]
                                       [k for _, k in group], [s.state.sampling for s, _ in group],
                                       [s.state.generator for s, _ in group])
            for (s, _), d in zip(group, got):
                drafts[id(s)] = d
        return [prepare(s.drafter, s.state, k, drafts.get(id(s))) for s, k in chosen]  # type: ignore[arg-type]


def _committed(slot: Slot) -> list[int]:
    """The ids whose keys and values are in the request's cache (between steps: its prompt as
    far as prefilled, or its prompt and every emitted id but the last)."""
    return slot.state.tokens[0, : slot.state.cache.length].tolist()


def _shared_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of a and b (slice compares run in C)."""
    lo, hi = 0, min(len(a), len(b))
    if hi == 0 or a[0] != b[0]:
        return 0
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
