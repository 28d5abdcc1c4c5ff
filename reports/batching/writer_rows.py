"""How full the data writer's forwards are: runs `mtpspec data` in this process with every target
forward timed, then prints the forwards by row count (calls, time, rows per call, rows per
second), their share of the run, the batch steps' time outside the forwards, and the rows that
prefilled prompts against the rows that decoded. Nothing else may run beside it.

    python reports/batching/writer_rows.py --out /tmp/writer-rows --num-samples 228 --seed 12 --threads 2

(the arguments are `mtpspec data`'s; these write the first four shards of v9-batch-seed12)
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict


def main() -> None:
    from mtpspec.cli import app
    from mtpspec.core import target

    from mtpspec.core import batch

    forward_many, step = target.Target.forward_many, batch.Batch.step
    calls: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0])  # 16-row bucket -> calls, seconds, rows
    kinds = {"prompt rows (prefilled)": 0, "decode rows (last token and drafts)": 0}
    steps = [0.0]

    def timed(self, seqs, hidden_layers=(-1,)):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = forward_many(self, seqs, hidden_layers)
        rows = sum(int(sq.input_ids.shape[1]) for sq in seqs)
        for sq in seqs:  # a prompt chunk keeps one row's logits; a decode round keeps all
            kinds["prompt rows (prefilled)" if sq.logits_to_keep == 1 else "decode rows (last token and drafts)"] += \
                int(sq.input_ids.shape[1])
        c = calls[rows // 16]
        c[0], c[1], c[2] = c[0] + 1, c[1] + time.perf_counter() - t0, c[2] + rows
        return out

    def timed_step(self):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = step(self)
        steps[0] += time.perf_counter() - t0
        return out

    target.Target.forward_many = timed  # type: ignore[method-assign]
    batch.Batch.step = timed_step  # type: ignore[method-assign]
    t0 = time.perf_counter()
    try:
        app(["data", *sys.argv[1:]], standalone_mode=False)
    finally:
        wall = time.perf_counter() - t0
        total = sum(c[1] for c in calls.values())
        print(f"\nforwards: {total:.1f} s of {wall:.1f} s ({total / wall:.0%}), "
              f"{sum(int(c[0]) for c in calls.values())} calls, {sum(int(c[2]) for c in calls.values())} rows")
        print(f"batch steps: {steps[0]:.1f} s, of which {steps[0] - total:.1f} s outside the forwards (drafts, "
              "acceptance, sampling); " + ", ".join(f"{k}: {v}" for k, v in kinds.items()))
        print("| rows | calls | s | rows per call | ms per call | rows per s |\n|---|---|---|---|---|---|")
        for b in sorted(calls):
            n, s, rows = calls[b]
            print(f"| {16 * b}-{16 * b + 15} | {int(n)} | {s:.1f} | {rows / n:.1f} | {s / n * 1000:.1f} | {rows / s:.0f} |")


if __name__ == "__main__":
    main()
