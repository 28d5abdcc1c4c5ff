"""The drafter protocol: anything that proposes k tokens for the target to verify.

The decode loop hands a drafter a `DraftInput` (the committed tokens, the target's features at
the last verified position and the target's cache, read-only) and gets back a `Draft`. The MTP
head is one implementation; tests plug in an oracle. K draft length, V vocabulary, F features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import DynamicCache

from ..config import SamplingConfig


@dataclass
class DraftInput:
    tokens: torch.Tensor  # (1, L + 1): prompt + accepted tokens; the last is not yet in the cache
    hidden: torch.Tensor  # (1, F): target features at position L - 1, the last cached position
    cache: DynamicCache  # the target's cache, L positions; a drafter must not modify it


@dataclass
class Draft:
    tokens: torch.Tensor  # (K,) proposed token ids
    q: torch.Tensor | None = None  # (K, V) the distribution each token was drawn from (sampling only)


@runtime_checkable
class Drafter(Protocol):
    def propose(
        self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        """Return k tokens. Greedy (sampling.greedy): any tokens, q may be None. Sampling: each
        token must be drawn from the returned q row (after the same temperature/top-k/top-p
        as the target), or the output distribution is no longer the target's."""
        ...
