"""Draft trees as plain data: a parent list in, positions, an attention mask and paths out.

Node 0 of the verify pass is the root (the last committed token); draft i is node i + 1, and
`parents[i]` (-1 = the root) is the draft it continues. A chain is parents = -1, 0, 1, ...
Letters: N drafts, M = N + 1 verify rows (root first)."""

from __future__ import annotations

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
