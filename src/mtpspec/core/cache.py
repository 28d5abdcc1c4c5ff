"""The target's KV cache: a static store indexed by slot, one slot per committed position.

Letters: N decoder layers, Hk key/value heads, S slots (capacity), hd head dim, P planes.

A verify pass writes its rows in place after the committed slots; rolling back is `keep` (drop
a suffix: move a length; keep a tree path: copy a few slots), never a concatenation. The head
reads it in place too (`layer`), and a tree verify on the torch path reads copies of it laid
out per branch (`planes`).

Most families give every layer the same key/value shape, and the cache is one (N, Hk, S, hd)
tensor per side. Gemma 4 does not: its full-attention layers have wider heads (and may have
fewer of them) than its sliding ones, and its last layers may compute no keys or values of
their own, reading those of an earlier layer of the same type (KV sharing). Such a cache is
*layered* (`KVCache.layered`): one (1, Hk_i, S, hd_i) store per layer that computes keys and
values, and `keys[i]` / `values[i]` a (Hk_i, S, hd_i) view of the store layer i reads, so a
shared layer reads its producer's slots in place and costs no memory. Everything below works
on both kinds: bulk slot moves run once per store.
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

    # (N, Hk, S, hd): plane 0 of `_planes`, when there are planes. A layered cache: a tuple of N
    # (Hk_i, S, hd_i) views of `_stores`, layer i's of store `_share[i]`. keys[i] is layer i's
    # either way.
    keys: torch.Tensor | tuple[torch.Tensor, ...]
    values: torch.Tensor | tuple[torch.Tensor, ...]
    length: int = 0
    # A fixed cache refuses to outgrow S (decoding sizes it once, so that attention spans the
    # same S slots in every pass); a growable one reallocates (one-off forwards, training).
    fixed: bool = True
    # (keys, values), each (N, P, Hk, S, hd), plane 0 = keys / values; None until a tree needs it.
    _planes: tuple[torch.Tensor, torch.Tensor] | None = None
    _synced: int = 0  # slots 0.._synced-1 of every plane equal the cache's
    # A layered cache: per layer, the index of the store it reads; and the stores, (keys, values)
    # each a list of (1, Hk_j, S, hd_j) tensors. () and None for a uniform cache.
    _share: tuple[int, ...] = ()
    _stores: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @classmethod
    def layered(cls, shapes: list[tuple[int, int]], share: list[int], capacity: int, dtype: torch.dtype,
                device: torch.device | str = "cpu", fixed: bool = True) -> KVCache:
        """A cache for layers of different key/value shapes: shapes[j] = (Hk_j, hd_j) of store j;
        share[i] = the store layer i reads and writes (layers that share keys and values name the
        same store)."""
        if sorted(set(share)) != list(range(len(shapes))):
            raise InputError(f"KVCache.layered: share {share} must name each of the {len(shapes)} stores.")
        stores = tuple([torch.zeros(1, hk, capacity, hd, dtype=dtype, device=device) for hk, hd in shapes] for _ in range(2))
        c = cls(keys=(), values=(), fixed=fixed, _share=tuple(share), _stores=(stores[0], stores[1]))
        c._views()
        return c

    def _views(self) -> None:
        """Point keys[i] / values[i] at the store layer i reads."""
        assert self._stores is not None
        self.keys, self.values = (tuple(st[j][0] for j in self._share) for st in self._stores)

    def _bulk(self) -> list[torch.Tensor]:
        """The tensors that hold every slot once, each (n, P?, Hk, S, hd) with slots on dim -2:
        the two (N, Hk, S, hd) tensors of a uniform cache, or every store of a layered one."""
        if self._stores is None:
            return [self.keys, self.values]  # type: ignore[list-item]
        return [*self._stores[0], *self._stores[1]]

    @property
    def capacity(self) -> int:
        keys = self.keys if self._stores is None else self._stores[0][0]  # (N or 1, Hk, S, hd)
        return int(keys.shape[-2])  # type: ignore[union-attr]

    @property
    def has_planes(self) -> bool:
        """Whether a tree verify made planes: keys and values are then views of plane 0."""
        return self._planes is not None

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of layer i's committed keys and values, (1, Hk, length, hd): zero copy."""
        return self.keys[i][:, : self.length].unsqueeze(0), self.values[i][:, : self.length].unsqueeze(0)

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep slots 0..start-1 and, after them, slots start + rows[0], start + rows[1], ...
        (ascending); everything else is dropped. rows = 0..n-1 drops a suffix without copying;
        a tree path moves its slots into place."""
        if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and (rows[0] < 0 or start + rows[-1] >= self.length)):
            raise InputError(f"keep: rows {rows} must ascend within the {self.length - start} slots after {start}.")
        if rows != list(range(len(rows))):
            for t in self._bulk():  # (n, Hk, S, hd) each
                src = torch.tensor(rows, device=t.device) + start
                t[:, :, start:start + len(rows)] = t[:, :, src]
        self.length = start + len(rows)
        self._synced = min(self._synced, start)

    def reserve(self, slots: int) -> None:
        """Make room for `slots` slots: a growable cache reallocates, a fixed one refuses."""
        if slots <= self.capacity:
            return
        if self.fixed:
            raise InputError(f"the cache holds {self.capacity} slots; {slots} were asked for.")
        S = -(-slots // SLOT_ALIGN) * SLOT_ALIGN

        def grown(old: torch.Tensor) -> torch.Tensor:
            n, Hk, _, hd = old.shape
            new = old.new_zeros(n, Hk, S, hd)
            new[:, :, : self.length] = old[:, :, : self.length]
            return new

        if self._stores is None:
            self.keys, self.values = grown(self.keys), grown(self.values)  # type: ignore[arg-type]
        else:
            self._stores = ([grown(t) for t in self._stores[0]], [grown(t) for t in self._stores[1]])
            self._views()
        self._planes, self._synced = None, 0

    def copy_prefix(self, src: KVCache, n: int) -> None:
        """Slots 0..n-1 copied from `src`, a cache of the same target, and everything after them
        dropped (length n). Where the forward computes every row on its own and attends only the
        slots it is given (the fused engine), these are the keys and values this cache's own
        forward over the same n tokens would have written, bit for bit."""
        dst_t, src_t = self._bulk(), src._bulk()
        def stores(ts: list[torch.Tensor]) -> list[tuple[int, ...]]:
            return [(*t.shape[:-2], t.shape[-1]) for t in ts]  # (n, Hk, hd) per store: all but the slots

        if stores(dst_t) != stores(src_t) or not 0 <= n <= min(src.length, self.capacity):
            raise InputError(f"copy_prefix: {n} slots from a cache of {src.length} committed slots and stores "
                             f"{[tuple(t.shape) for t in src_t]} into one of {self.capacity} slots and stores "
                             f"{[tuple(t.shape) for t in dst_t]}: they must come from the same target.")
        for d, t in zip(dst_t, src_t):  # (n, Hk, S, hd) each
            d[..., :n, :] = t[..., :n, :]
        self.length = n
        self._synced = 0

    def truncate(self, length: int) -> None:
        """Drop every slot from `length` on (a chain's rejected drafts)."""
        self.keep(length, [])

    def planes(self, count: int, synced_to: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values), each (N, P >= count, Hk, S, hd): plane 0 is the cache itself, and slots
        0..synced_to-1 of every plane equal the cache's. Made on first use (memory: one cache
        per plane); later calls copy only the slots committed since the last one. A layered
        cache returns tuples of N (P, Hk_i, S, hd_i) views instead: [i] reads alike."""
        if self._planes is None or self._planes_count() < count:
            def spread(t: torch.Tensor) -> torch.Tensor:  # (n, Hk, S, hd) -> (n, count, Hk, S, hd), plane 0 = t
                n, Hk, S, hd = t.shape
                p = t.new_zeros(n, count, Hk, S, hd)
                p[:, 0] = t
                return p

            if self._stores is None:
                kp, vp = spread(self.keys), spread(self.values)  # type: ignore[arg-type]
                self.keys, self.values = kp[:, 0], vp[:, 0]  # the cache now lives in plane 0
                self._planes = (kp, vp)
            else:
                kps, vps = [spread(t) for t in self._stores[0]], [spread(t) for t in self._stores[1]]
                self._stores = ([p[:, 0] for p in kps], [p[:, 0] for p in vps])
                self._views()
                self._planes = (kps, vps)  # type: ignore[assignment]
            self._synced = 0
        if self._synced < synced_to:
            for t in self._plane_tensors():  # one copy per store for every layer and plane
                t[:, 1:, :, self._synced:synced_to] = t[:, :1, :, self._synced:synced_to]
            self._synced = synced_to
        if self._stores is None:
            return self._planes
        kps, vps = self._planes  # type: ignore[misc]
        return tuple(kps[j][0] for j in self._share), tuple(vps[j][0] for j in self._share)  # type: ignore[return-value]

    def _plane_tensors(self) -> list[torch.Tensor]:
        assert self._planes is not None
        if self._stores is None:
            return list(self._planes)
        return [*self._planes[0], *self._planes[1]]  # type: ignore[misc]

    def _planes_count(self) -> int:
        return int(self._plane_tensors()[0].shape[1])
