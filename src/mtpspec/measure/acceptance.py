"""How many tokens a head gets accepted: mean accepted tokens per target forward, per prompt
category, per draft length k and per sampling temperature, plus per-position rates. The head
drafts a chain of k tokens, or (with a `TreeConfig`) a tree of at most k nodes, as
`mtpspec generate --tree` and `bench --methods mtp-tree` do; a tree's per-position rates are per
depth.

This measures acceptance only (no timing, so it may run beside other work); speed is
`mtpspec bench`'s job. Sampled runs use a fixed seed per prompt, so a table is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ..core.decode import generate
from ..core.drafters import TreeConfig, build_drafter
from ..core.stats import DecodeStats
from ..core.target import Target
from ..prompts import Prompt

ALL = "all"


@dataclass(frozen=True)
class AcceptanceRow:
    """One cell of the table: every prompt of `category` run at k drafts per round and one
    temperature, their DecodeStats merged into one."""

    k: int  # num_draft_tokens: drafts per round, or a tree's most nodes per round
    temperature: float
    category: str
    prompts: int
    stats: DecodeStats
    drafter: str = "chain"  # or "tree"

    def to_dict(self) -> dict[str, Any]:
        s = self.stats
        return {"k": self.k, "drafter": self.drafter, "temperature": self.temperature, "category": self.category,
                "prompts": self.prompts,
                "new_tokens": s.new_tokens, "mean_accepted": round(s.mean_accepted, 3),
                "position_acceptance": [round(r, 3) for r in s.position_acceptance],
                "position_checked": s.pos_checked}  # rounds that reached each position (a tree: depth); 0 = never


def measure_acceptance(target: Target, head: Any, prompts: Sequence[Prompt], inputs: Sequence[torch.Tensor],
                       num_draft_tokens: Sequence[int], temperatures: Sequence[float], max_new_tokens: int = 128,
                       top_p: float = 1.0, seed: int = 0, progress: bool = True,
                       tree: TreeConfig | None = None) -> list[AcceptanceRow]:
    """Run every prompt at every k in `num_draft_tokens` and every temperature; one row per
    (k, temperature, category), plus the category ALL over every prompt. With `tree`, each run
    drafts a tree of at most k nodes from a fresh `TreeDrafter` (its running means start anew,
    so a prompt's figure does not depend on the prompts before it)."""
    runs: dict[tuple[int, float, str], list[DecodeStats]] = {}
    bar = tqdm(total=len(prompts) * len(num_draft_tokens) * len(temperatures), desc="acceptance", unit="run",
               disable=not progress)
    for i, (p, ids) in enumerate(zip(prompts, inputs)):
        for k in num_draft_tokens:
            for temp in temperatures:
                drafter, _ = build_drafter(head, "chain" if tree is None else "tree", k=k, tree=tree)
                out = generate(target, drafter, ids, max_new_tokens=max_new_tokens, num_draft_tokens=k,
                               temperature=temp, top_p=top_p if temp > 0 else 1.0, seed=seed + i if temp > 0 else None)
                for cat in (p.category, ALL):
                    runs.setdefault((k, temp, cat), []).append(out.stats)
                bar.update()
    bar.close()
    kind = "chain" if tree is None else "tree"
    return [AcceptanceRow(k, t, c, len(stats), DecodeStats.merge(stats), kind) for (k, t, c), stats in runs.items()]


def markdown(rows: Sequence[AcceptanceRow]) -> str:
    """One table per temperature: categories down, k across; then per-position rates (all)."""
    out = []
    temps = sorted({r.temperature for r in rows})
    ks = sorted({r.k for r in rows})
    cats = sorted({r.category for r in rows} - {ALL}) + [ALL]
    by = {(r.k, r.temperature, r.category): r for r in rows}
    tree = any(r.drafter == "tree" for r in rows)
    what, col, pos = ("a tree of at most N nodes per round", "N", "depth") if tree else ("a chain of k drafts", "k", "position")
    for t in temps:
        out.append(f"\nMean accepted tokens per target forward, {what}, temperature {t:g}:\n")
        out.append("| category | prompts | " + " | ".join(f"{col}={k}" for k in ks) + " |")
        out.append("|---|---:|" + "---:|" * len(ks))
        for c in cats:
            cells = [f"{by[(k, t, c)].stats.mean_accepted:.2f}" if (k, t, c) in by else "-" for k in ks]
            n = next((by[(k, t, c)].prompts for k in ks if (k, t, c) in by), 0)
            out.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
        kmax = max(ks)
        if (kmax, t, ALL) in by:
            st = by[(kmax, t, ALL)].stats
            reached = max((i + 1 for i, c in enumerate(st.pos_checked) if c), default=0)  # a tree stops at its depth
            cells = [f"{r:.2f}" if c else "-" for r, c in zip(st.position_acceptance[:reached], st.pos_checked)]
            out.append(f"\nPer-{pos} acceptance at {col}={kmax} (conditional on the earlier drafts passing): "
                       + ", ".join(f"{i + 1}: {x}" for i, x in enumerate(cells)))
    return "\n".join(out) + "\n"
