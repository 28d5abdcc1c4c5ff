"""Acceptance vs response tokens trained on, from a run of run.sh: held-out (metrics.jsonl, the
split `mtpspec train` makes) and decoded on the built-in set (each stop's acceptance file).
Response tokens seen at step s are counted exactly, replaying the run's own batch order.

    python reports/data-curve/plot.py runs/data-curve reports/data-curve
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mtpspec.training.activations import Samples, load_cache  # noqa: E402
from mtpspec.training.train import TrainConfig, epoch_batches, split  # noqa: E402

run, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = TrainConfig(holdout=0.04, batch_size=16)  # run.sh's split and batches (seed 0)
train = Samples([])
for d in sorted(run.glob("activations*"), key=lambda p: (len(p.name), p.name)):
    train = train + split(load_cache(d), cfg)[0]
resp = [len(ids) - p for ids, p in train.tokens()]
seen, total = [0], 0
for batch in epoch_batches(len(train), cfg, 0):
    total += sum(resp[i] for i in batch)
    seen.append(total)

held = [json.loads(line) for line in (run / "metrics.jsonl").open() if "accept_rounds" in line]
decoded = []
for f in sorted(run.glob("heads/step*/acceptance-builtin.json"), key=lambda p: int(p.parent.name[4:])):
    step = int(f.parent.name[4:])
    row = next(r for r in json.loads(f.read_text()) if r["category"] == "all")
    decoded.append((step, row["mean_accepted"], row["position_acceptance"][0]))

lines = ["| steps | response tokens seen | held-out, real rounds (k = 6) | held-out, every row | first draft (held-out) |",
         "|---|---|---|---|---|"]
for r in held:
    lines.append(f"| {r['step']} | {seen[r['step']]:,} | {r['accept_rounds']:.3f} | {r['accept']:.3f} | {r['pos1']:.3f} |")
lines += ["", "| steps | response tokens seen | built-in 24, decoded (k = 4) | first draft |", "|---|---|---|---|"]
for step, acc, first in decoded:
    lines.append(f"| {step} | {seen[step]:,} | {acc:.3f} | {first:.3f} |")
(out / "curve.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))

fig, ax = plt.subplots(figsize=(6.4, 4.0))
ax.plot([seen[r["step"]] / 1e6 for r in held], [r["accept_rounds"] for r in held], "o-", label="held-out, real rounds (k = 6)")
ax.plot([seen[s] / 1e6 for s, _, _ in decoded], [a for _, a, _ in decoded], "s-", label="built-in 24, decoded (k = 4)")
ax.set_xscale("log")
ax.set_xlabel("response tokens trained on (millions, one epoch, from scratch)")
ax.set_ylabel("tokens per target forward")
ax.set_title("SmolLM2-135M-Instruct head: acceptance vs data")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(out / "curve.png", dpi=120)
