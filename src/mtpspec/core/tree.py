"""Draft trees as plain data: a parent list in, positions, an attention mask and paths out.

Node 0 of the verify pass is the root (the last committed token); draft i is node i + 1, and
`parents[i]` (-1 = the root) is the draft it continues. A chain is parents = -1, 0, 1, ...
Letters: N drafts, M = N + 1 verify rows (root first).

`TreeLayout` is what a verify pass needs of a tree, derived once from the parents (`decode.step`
builds it) and handed to the forward, so that neither forward re-derives it from a mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


def _check(parents: list[int]) -> None:
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise InputError(f"parents[{i}] = {p}: each draft's parent must be -1 (the root) or an earlier draft.")


def depths(parents: list[int]) -> list[int]:
    """(M,) depth of every verify row: the root is 0, a draft is its parent's depth + 1."""
    _check(parents)
    d = [0]
    for p in parents:
        d.append(d[p + 1] + 1)
    return d


def positions(parents: list[int], start: int) -> torch.Tensor:
    """(M,) text position of every verify row; the root sits at `start`."""
    return start + torch.tensor(depths(parents))


def tree_mask(parents: list[int]) -> torch.Tensor:
    """(M, M) bool: row r may attend row c iff c is r or one of r's ancestors."""
    _check(parents)
    M = len(parents) + 1
    mask = torch.eye(M, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[i + 1] |= mask[p + 1]  # a node sees what its parent sees, and itself
    return mask


def path_to(parents: list[int], row: int) -> list[int]:
    """Verify rows from the root to `row`, inclusive, in order (ascending, since parents[i] < i)."""
    _check(parents)
    out = [row]
    while out[-1] != 0:
        out.append(parents[out[-1] - 1] + 1)
    return out[::-1]


def children(parents: list[int]) -> list[list[int]]:
    """(M,) lists: the verify rows whose parent is each row."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i + 1)
    return kids


def spine_first(parents: list[int]) -> tuple[list[int], list[int]]:
    """Reorder a draft so that its spine comes first: from the root, repeatedly the first child
    in draft order (a drafter's most likely path), in depth order; then every other draft in
    its original relative order. Returns (order, new parents): new draft j is old draft
    order[j]. Each parent still precedes its children, siblings keep their relative order (so
    acceptance tries them in the same turn), and a chain is unchanged. Why: the verify pass runs
    leading rows that form a chain straight on the cache, and only the rest on copies of it
    (`Target.forward`)."""
    _check(parents)
    kids = children(parents)
    spine, row = [], 0
    while kids[row]:
        row = kids[row][0]
        spine.append(row - 1)
    on_spine = set(spine)
    order = spine + [i for i in range(len(parents)) if i not in on_spine]
    new_index = {old: new for new, old in enumerate(order)}
    new_index[-1] = -1
    return order, [new_index[parents[old]] for old in order]


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """One verify pass's tree: M rows, the root first, every parent before its children.

    Row r attends the committed cache, then its ancestors and itself in depth order (the rows
    it would see had its path been decoded one token at a time). Tensors live on the CPU."""

    parents: tuple[int, ...]  # (N,) each draft's parent draft, -1 = the root
    depths: torch.Tensor  # (M,) int64: the root 0, a draft its parent's depth + 1
    mask: torch.Tensor  # (M, M) bool: row r may attend row c iff c is r or one of r's ancestors
    nanc: torch.Tensor  # (M,) int32: how many rows row r attends (its ancestors and itself)
    anc: torch.Tensor  # (M, M) int32: row r's ancestors and itself in depth order, then M as padding
    spine: int  # leading rows whose ancestors are exactly the rows before them (1..M)

    @classmethod
    def from_parents(cls, parents: list[int] | tuple[int, ...]) -> TreeLayout:
        parents = tuple(int(p) for p in parents)
        mask = tree_mask(list(parents))  # (M, M); checks the parents
        M = mask.shape[0]
        nanc = mask.sum(-1)  # (M,)
        order = torch.arange(M).expand(M, M)
        anc = torch.where(mask, order, M).sort(-1).values  # (M, M): ascending index = depth order
        spine = 1
        while spine < M and parents[spine - 1] == spine - 2:
            spine += 1
        return cls(parents=parents, depths=nanc - 1, mask=mask, nanc=nanc.to(torch.int32).contiguous(),
                   anc=anc.to(torch.int32).contiguous(), spine=spine)

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> TreeLayout:
        """The layout of a tree given as its (M, M) mask (`tree_mask`), for callers that pass
        masks; refuses a mask that is not a tree's."""
        if mask.dim() != 2 or mask.shape[0] != mask.shape[1] or mask.shape[0] == 0:
            raise InputError(f"a tree mask is square (M, M) with M >= 1; got {tuple(mask.shape)}.")
        m = mask.bool().cpu()
        M = m.shape[0]
        parents = []
        for r in range(1, M):
            seen = m[r, :r].nonzero()
            parents.append(int(seen[-1]) - 1 if seen.numel() else -2)  # the nearest ancestor; -2: none, refused below
        if any(p < -1 for p in parents) or not torch.equal(tree_mask(parents), m):
            raise InputError("tree_mask is not a tree's mask: build it with mtpspec.core.tree.tree_mask(parents).")
        return cls.from_parents(parents)

    @property
    def rows(self) -> int:
        """M, the verify rows: the root and the drafts."""
        return len(self.parents) + 1

    @property
    def is_chain(self) -> bool:
        """Every row continues the one before it: verified as a chain is, with a causal mask."""
        return self.spine == self.rows

    def positions(self, start: int) -> torch.Tensor:
        """(M,) text position of every row when the root sits at `start`."""
        return start + self.depths
