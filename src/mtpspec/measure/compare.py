"""`mtpspec generate --compare`: the same request decoded with the head and plainly (k = 0),
timed alike, so one command shows what the head buys on this machine.

Both paths run once on a few tokens first, untimed, so neither timing pays for first-call
setup (allocator warm-up, kernel selection). Wall time is measured around each whole call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.decode import GenerateOutput, generate

WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Comparison:
    spec: GenerateOutput  # with the head, k drafts per round
    plain: GenerateOutput  # k = 0: one target forward per token
    spec_s: float  # wall seconds of each call
    plain_s: float

    @property
    def identical(self) -> bool:
        """Whether both outputs are the same tokens (always, when greedy in fp32)."""
        return torch.equal(self.spec.sequences, self.plain.sequences)

    @property
    def spec_tokens_per_s(self) -> float:
        return self.spec.stats.new_tokens / self.spec_s

    @property
    def plain_tokens_per_s(self) -> float:
        return self.plain.stats.new_tokens / self.plain_s

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_s / self.plain_tokens_per_s


def compare(target: Any, head: Any, input_ids: torch.Tensor, num_draft_tokens: int, max_new_tokens: int = 128,
            on_tokens: Callable[[list[int]], None] | None = None, acceptance: Any = None, **sampling: Any) -> Comparison:
    """Decode `input_ids` with `head` at `num_draft_tokens`, then plainly, with the same
    sampling settings (temperature, top_k, top_p, seed); `on_tokens` streams the first run.
    `acceptance`: the head's run's rule (None: exact); plain decoding has no drafts to relax."""
    for drafter, k in ((head, num_draft_tokens), (None, 0)):
        generate(target, drafter, input_ids, max_new_tokens=min(WARMUP_TOKENS, max_new_tokens), num_draft_tokens=k,
                 acceptance=acceptance if k else None, **sampling)
    t0 = time.perf_counter()
    spec = generate(target, head, input_ids, max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens,
                    on_tokens=on_tokens, acceptance=acceptance, **sampling)
    t1 = time.perf_counter()
    plain = generate(target, None, input_ids, max_new_tokens=max_new_tokens, num_draft_tokens=0, **sampling)
    t2 = time.perf_counter()
    return Comparison(spec, plain, t1 - t0, t2 - t1)
