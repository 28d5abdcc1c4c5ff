"""A GGUF target's blocks on the AMX tiles against their dequantized dense copy on the same tiles:
the fused forward over n one-row sequences, each with its own cache of L positions, both targets
in this one process (medians of 7, best of two interleaved rounds; ms), and whether their logits
are equal (they must be: the tiles compute the same numbers from the same bf16 values). Needs a
CPU with AMX; nothing else may run beside it.

    python reports/batching/dense_vs_blocks.py
"""

from __future__ import annotations

import torch

import mtpspec
from mtpspec.core import fused
from mtpspec.core.fused import SeqRows
from mtpspec.measure.costs import median_time
from mtpspec.models import load_target


def main() -> None:
    torch.set_num_threads(2)
    if not fused.amx_blocks(True):
        raise SystemExit("this CPU has no AMX tiles (or the fused forward is off): nothing to compare")
    targets = {w: mtpspec.Target(load_target(None, "auto", w).model) for w in ("gguf", "dense")}
    g = torch.Generator().manual_seed(0)
    print("| positions | sequences | blocks ms | dense copy ms | logits equal |\n|---|---|---|---|---|")
    for L in (8, 200, 500):
        for n in (1, 16, 64):
            ids = [torch.randint(0, 49152, (1, 1), generator=g) for _ in range(n)]
            caches = {}
            for w, t in targets.items():
                caches[w] = [t.new_cache(L + 64) for _ in range(n)]
                for c in caches[w]:
                    t.forward(torch.randint(0, t.vocab_size, (1, L), generator=torch.Generator().manual_seed(1)), c)
            ms: dict[str, list[float]] = {}

            def run(w: str) -> list:
                for c in caches[w]:
                    c.length = L
                return targets[w].forward_many([SeqRows(i, c) for i, c in zip(ids, caches[w])])

            for _ in range(2):
                for w in targets:
                    ms.setdefault(w, []).append(median_time(lambda w=w: run(w), 7) * 1000)
            same = all(torch.equal(a.logits, b.logits) for a, b in zip(run("gguf"), run("dense")))
            print(f"| {L} | {n} | {min(ms['gguf']):.2f} | {min(ms['dense']):.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
