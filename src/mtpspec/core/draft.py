"""The drafter protocol, and drafts as plain data.

The decode loop hands a drafter a `DraftInput` (the committed tokens, the target's features at
the last verified position and the target's cache, read-only) and gets back a `Draft`: tokens
and, for each, its parent. A chain is parent i - 1; a tree is any other parent list, so the
loop verifies both the same way (`tree.py` turns parents into positions and masks).
Letters: N draft tokens, V vocabulary, F features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .cache import KVCache


@dataclass
class DraftInput:
    tokens: torch.Tensor  # (1, L + 1): prompt + accepted tokens; the last is not yet in the cache
    hidden: torch.Tensor  # (1, F): target features (the drafter's `hidden_layers`) at position L - 1
    cache: KVCache  # the target's cache, L committed positions; a drafter must not modify it
    # The request's scratch between its rounds (its `DecodeState.draft_memo`), where a drafter may
    # keep what the next round can reuse (the head: its round vocabulary so far); None: nothing kept.
    memo: dict | None = None


@dataclass
class Draft:
    tokens: torch.Tensor  # (N,) proposed token ids
    # (N,) index of each token's parent among the drafts, -1 for the root (the last committed
    # token); parents[i] < i. None = a chain (parent i - 1).
    parents: torch.Tensor | None = None
    # (N, V) the distribution each token was drawn from, given the drafts before it (sampling
    # only). None = every token was proposed deterministically (a top-w tree, prompt lookup):
    # verified against point masses, which is exact too, only accepted less often.
    q: torch.Tensor | None = None

    def __post_init__(self) -> None:
        N = self.tokens.shape[0]
        if self.tokens.dim() != 1:
            raise InputError(f"Draft.tokens must be 1-D (N,), got shape {tuple(self.tokens.shape)}.")
        if self.parents is not None:
            p = self.parents
            if p.shape != (N,) or bool((p >= torch.arange(N)).any()) or bool((p < -1).any()):
                raise InputError(f"Draft.parents must be (N,) with -1 <= parents[i] < i, got {p.tolist()}.")
        if self.q is not None and self.q.shape[0] != N:
            raise InputError(f"Draft.q has {self.q.shape[0]} rows for {N} tokens.")

    @property
    def is_chain(self) -> bool:
        return self.parents is None or bool((self.parents == torch.arange(len(self.parents)) - 1).all())

    def parent_list(self) -> list[int]:
        N = self.tokens.shape[0]
        return list(range(-1, N - 1)) if self.parents is None else [int(p) for p in self.parents]


@runtime_checkable
class Drafter(Protocol):
    # Which target features the loop passes as DraftInput.hidden (indices as HF's
    # `output_hidden_states` counts them; (-1,) = the final normed hidden state).
    hidden_layers: tuple[int, ...]

    def propose(
        self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        """Return a chain of k tokens (or a tree of k nodes). Greedy (sampling.greedy): any
        tokens, q may be None. Sampling: either q is None (the tokens are verified as point
        masses: any tokens, exact) or each token must be drawn from its q row, given the drafts
        before it (after the same temperature/top-k/top-p as the target); a q that misreports
        the law the tokens came from makes the output no longer the target's."""
        ...

    def update(self, drafted: int, accepted: int) -> None:
        """Feedback after each round: `drafted` tokens were checked, the first `accepted` of the
        chain (or nodes of the accepted path) passed. Lets a drafter adapt its next proposal."""
        ...
