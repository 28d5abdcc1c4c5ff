"""The data writer's generation through mtpspec's own decode loop (`core/batch.py`): many rows
decoded together with continuous batching, the greedy answers drafted by an MTP head.

Why: Hugging Face's batched `generate` (`fast_generate.py`) wrote ~100 response tokens per second
on 2 cores, and the kept data's acceptance curve was still rising when that speed stopped it.
Here each forward reads the GGUF file's blocks once for all its rows (`fused.c`), finished rows
leave and new ones join at once (no padding to the longest row, no idle rows), and the head's
drafts let a greedy row emit several tokens per forward.

What it writes is mtpspec's own decoding of each row, bit for bit: a greedy row is the target's
plain greedy decoding (drafts never change it); a sampled row is the target's plain sampled
decoding (temperature, top-p `TOP_P`, no top-k) with its own seed, drawn for the rows of a job
in row order from the generator the job is submitted with (the writer's: one per data batch,
seeded from the batch's place in the prompt stream), so a resumed set writes what an
uninterrupted one would have. Sets written this way record it (`GENERATION`); sets written by
HF's generate are extended by HF's generate, as they were written.

`RowPool` takes jobs (rows to decode) from several data batches at once and keeps one `Batch`
full with them, oldest job first: while one data batch waits for its slowest rows, the next
one's rows fill the forward. Because each row's output does not depend on what it is batched
with, this changes no token, only how full each forward is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import SamplingConfig
from ..core.batch import BATCH_ROWS_MAX, Batch, BatchConfig
from ..core.target import Target

GENERATION = {"engine": "mtpspec-batch", "sampling": "mtpspec-seeded-rows"}
# Rows decoded together: each holds its own cache (about 12 MB for SmolLM2 at 512 positions).
MAX_RUNNING = 48
# Finished rows whose caches a writer keeps for the prompts that begin as theirs did
# (`BatchConfig.prefix_keep`; ~17 MB each for SmolLM2 at 768 slots). Of the 47,442 prompt
# positions that `mtpspec data --num-samples 228 --seed 12` prefills, 32% begin as a running
# row's text; with the last 16 / 64 / 128 finished rows kept too, 45 / 51 / 59%.
PREFIX_KEEP = 64


@dataclass(eq=False)
class Job:
    """Rows to decode with one length limit and temperature; `out[i]` is row i's new ids (ending
    with its stop id, if it stopped) once `done`."""

    rows: list[list[int]]
    max_new: int
    temperature: float
    seeds: list[int]
    out: list[list[int]] = field(default_factory=list)
    left: int = 0

    @property
    def done(self) -> bool:
        return self.left == 0


class RowPool:
    """The rows of many jobs through one `Batch`, at most `max_running` at once, the oldest job's
    rows first. Greedy rows (temperature 0) are drafted by `head` with up to k drafts a round
    (fewer when many rows share a forward); sampled rows are not drafted (a seeded row's k would
    be fixed whatever the load, and sampled drafts pay little in a full batch)."""

    def __init__(self, target: Target, top_p: float, stop_ids: list[int], head: Any = None, k: int = 0,
                 config: BatchConfig | None = None, max_running: int = MAX_RUNNING):
        self.top_p, self.stop_ids, self.head, self.k = top_p, stop_ids, head, k
        self.max_running = max_running
        self.batch = Batch(target, config or BatchConfig(max_rows=BATCH_ROWS_MAX, prefix_keep=PREFIX_KEEP))
        self.pending: deque[tuple[Job, int]] = deque()  # rows not yet in the batch, oldest first
        self.live: dict[int, tuple[Job, int]] = {}  # id(slot) -> (job, row)

    def submit(self, rows: list[list[int]], max_new: int, temperature: float,
               generator: torch.Generator | None = None) -> Job:
        """Queue a job. Its rows' seeds are drawn now, in row order, from `generator` (None: torch's
        global generator), whether they sample or not, so that each job's draws are fixed."""
        seeds = torch.randint(0, 2**62, (len(rows),), generator=generator).tolist()
        job = Job(rows, max_new, temperature, seeds, [[] for _ in rows], len(rows))
        self.pending.extend((job, i) for i in range(len(rows)))
        return job

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.live)

    def step(self) -> None:
        """Fill the batch from the queue, then one forward; finished rows leave with their ids."""
        while self.pending and len(self.live) < self.max_running:
            job, i = self.pending.popleft()
            greedy = job.temperature <= 0
            sampling = SamplingConfig() if greedy else SamplingConfig(temperature=job.temperature, top_p=self.top_p,
                                                                      top_k=0, seed=job.seeds[i])
            slot = self.batch.add(torch.tensor([job.rows[i]]), job.max_new, self.head if greedy else None,
                                  self.k if greedy else 0, sampling, self.stop_ids)
            self.live[id(slot)] = (job, i)
        self.batch.step()
        for slot in [s for s in self.batch.slots if s.done]:
            job, i = self.live.pop(id(slot))
            job.out[i] = slot.state.new_tokens
            job.left -= 1
            self.batch.remove(slot)


def batch_generate(target: Target, rows: list[list[int]], max_new: int, temperature: float, top_p: float,
                   stop_ids: list[int], head: Any = None, k: int = 0,
                   config: BatchConfig | None = None) -> list[list[int]]:
    """Each row's new ids (ending with its stop id, if it stopped), in row order: one job alone
    through a `RowPool`, its seeds drawn from torch's global generator."""
    pool = RowPool(target, top_p, stop_ids, head, k, config)
    job = pool.submit(rows, max_new, temperature)
    while not job.done:
        pool.step()
    return job.out
