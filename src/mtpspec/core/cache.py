"""The target's KV cache: a static store indexed by slot, one slot per committed position.

Letters: N decoder layers, Hk key/value heads, S slots (capacity), hd head dim, P planes.

A verify pass writes its rows in place after the committed slots; rolling back is `keep` (drop
a suffix: move a length; keep a tree path: copy a few slots), never a concatenation. The head
reads it in place too (`layer`), and a tree verify on the torch path reads copies of it laid
out per branch (`planes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError

SLOT_ALIGN = 64  # cache capacity is a multiple of this: fewer distinct attention lengths


@dataclass
class KVCache:
    """The target's keys (RoPE applied) and values, one slot per committed position.

    Slots 0..length-1 hold positions 0..length-1 of the text so far. A forward appends its T
    tokens at slots length..length+T-1; `keep` then decides which of them stay.

    A tree verify also uses planes: extra copies of the cache, one per branch, stored beside the
    cache itself (plane 0) so that one batched attention call reads them all. A plane keeps its
    copy of the committed slots from round to round; each round copies only the slots
    committed since (`planes`) and its branch's few new slots, not the whole cache."""

    keys: torch.Tensor  # (N, Hk, S, hd): plane 0 of `_planes`, when there are planes
    values: torch.Tensor  # (N, Hk, S, hd)
    length: int = 0
    # A fixed cache refuses to outgrow S (decoding sizes it once, so that attention spans the
    # same S slots in every pass); a growable one reallocates (one-off forwards, training).
    fixed: bool = True
    # (keys, values), each (N, P, Hk, S, hd), plane 0 = keys / values; None until a tree needs it.
    _planes: tuple[torch.Tensor, torch.Tensor] | None = None
    _synced: int = 0  # slots 0.._synced-1 of every plane equal the cache's

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def has_planes(self) -> bool:
        """Whether a tree verify made planes: keys and values are then views of plane 0."""
        return self._planes is not None

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of layer i's committed keys and values, (1, Hk, length, hd): zero copy."""
        return self.keys[i, :, : self.length].unsqueeze(0), self.values[i, :, : self.length].unsqueeze(0)

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep slots 0..start-1 and, after them, slots start + rows[0], start + rows[1], ...
        (ascending); everything else is dropped. rows = 0..n-1 drops a suffix without copying;
        a tree path moves its slots into place."""
        if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and (rows[0] < 0 or start + rows[-1] >= self.length)):
            raise InputError(f"keep: rows {rows} must ascend within the {self.length - start} slots after {start}.")
        if rows != list(range(len(rows))):
            src = torch.tensor(rows, device=self.keys.device) + start
            self.keys[:, :, start:start + len(rows)] = self.keys[:, :, src]
            self.values[:, :, start:start + len(rows)] = self.values[:, :, src]
        self.length = start + len(rows)
        self._synced = min(self._synced, start)

    def reserve(self, slots: int) -> None:
        """Make room for `slots` slots: a growable cache reallocates, a fixed one refuses."""
        if slots <= self.capacity:
            return
        if self.fixed:
            raise InputError(f"the cache holds {self.capacity} slots; {slots} were asked for.")
        S = -(-slots // SLOT_ALIGN) * SLOT_ALIGN
        N, Hk, _, hd = self.keys.shape
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(N, Hk, S, hd)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self._planes, self._synced = None, 0

    def truncate(self, length: int) -> None:
        """Drop every slot from `length` on (a chain's rejected drafts)."""
        self.keep(length, [])

    def planes(self, count: int, synced_to: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values), each (N, P >= count, Hk, S, hd): plane 0 is the cache itself, and slots
        0..synced_to-1 of every plane equal the cache's. Made on first use (memory: one cache
        per plane); later calls copy only the slots committed since the last one."""
        if self._planes is None or self._planes[0].shape[1] < count:
            N, Hk, S, hd = self.keys.shape
            store = []
            for name in ("keys", "values"):
                t = getattr(self, name).new_zeros(N, count, Hk, S, hd)
                t[:, 0] = getattr(self, name)
                setattr(self, name, t[:, 0])  # the cache now lives in plane 0
                store.append(t)
            self._planes, self._synced = (store[0], store[1]), 0
        if self._synced < synced_to:
            for t in self._planes:  # one copy for every layer and plane
                t[:, 1:, :, self._synced:synced_to] = t[:, :1, :, self._synced:synced_to]
            self._synced = synced_to
        return self._planes
