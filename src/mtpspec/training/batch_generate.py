"""The data writer's generation through mtpspec's own decode loop (`core/batch.py`): many rows
decoded together with continuous batching, the greedy answers drafted by an MTP head.

Why: Hugging Face's batched `generate` (`fast_generate.py`) wrote ~100 response tokens per second
on 2 cores, and the kept data's acceptance curve was still rising when that speed stopped it.
Here each forward reads the GGUF file's blocks once for all its rows (`fused.c`), finished rows
leave and new ones join at once (no padding to the longest row, no idle rows), and the head's
drafts let a greedy row emit several tokens per forward.

What it writes is mtpspec's own decoding of each row, bit for bit: a greedy row is the target's
plain greedy decoding (drafts never change it); a sampled row is the target's plain sampled
decoding (temperature, top-p `TOP_P`, no top-k) with its own seed, drawn from torch's global
generator, which `generate_data` seeds per batch, so a resumed set writes what an uninterrupted
one would have. Sets written this way record it (`GENERATION`); sets written by HF's generate are
extended by HF's generate, as they were written.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import SamplingConfig
from ..core.batch import BATCH_ROWS_MAX, Batch, BatchConfig
from ..core.target import Target

GENERATION = {"engine": "mtpspec-batch", "sampling": "mtpspec-seeded-rows"}
# Rows decoded together: each holds its own cache (about 12 MB for SmolLM2 at 512 positions).
MAX_RUNNING = 48


def batch_generate(target: Target, rows: list[list[int]], max_new: int, temperature: float, top_p: float,
                   stop_ids: list[int], head: Any = None, k: int = 0,
                   config: BatchConfig | None = None) -> list[list[int]]:
    """Each row's new ids (ending with its stop id, if it stopped), in row order. Greedy rows
    (temperature 0) are drafted by `head` with up to k drafts a round (fewer when many rows
    share a forward); sampled rows are not drafted (a seeded row's k would be fixed whatever the
    load, and sampled drafts pay little in a full batch)."""
    seeds = torch.randint(0, 2**62, (len(rows),)).tolist()  # from the global generator, seeded per batch
    greedy = temperature <= 0
    batch = Batch(target, config or BatchConfig(max_rows=BATCH_ROWS_MAX))
    out: list[list[int]] = [[] for _ in rows]
    pending = list(range(len(rows)))[::-1]
    live: dict[int, int] = {}  # id(slot) -> row
    while pending or live:
        while pending and len(live) < MAX_RUNNING:
            i = pending.pop()
            sampling = SamplingConfig() if greedy else SamplingConfig(temperature=temperature, top_p=top_p, top_k=0,
                                                                      seed=seeds[i])
            slot = batch.add(torch.tensor([rows[i]]), max_new, head if greedy else None, k if greedy else 0, sampling,
                             stop_ids)
            live[id(slot)] = i
        batch.step()
        for slot in [s for s in batch.slots if s.done]:
            out[live.pop(id(slot))] = slot.state.new_tokens
            batch.remove(slot)
    return out
