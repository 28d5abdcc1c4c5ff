"""Acceptance vs response tokens trained on, from a run of run.sh: held-out (metrics.jsonl, the
split `mtpspec train` makes) and decoded on the built-in set and the independent on-device set
(each stop's acceptance files).
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
K = len([k for k in held[0] if k.startswith("pos")]) if held else 2  # the run's unrolled draft steps


def stop_step(d: Path) -> int:
    return len(seen) - 1 if d.name == "stepend" else int(d.name[4:])  # "end": the whole epoch


decoded = {}  # set name -> [(step, mean accepted, first-draft rate)]
for name in ("builtin", "people"):
    rows = []
    for f in run.glob(f"heads/step*/acceptance-{name}.json"):
        row = next(r for r in json.loads(f.read_text()) if r["category"] == "all")
        rows.append((stop_step(f.parent), row["mean_accepted"], row["position_acceptance"][0]))
    decoded[name] = sorted(rows)

lines = [f"| steps | response tokens seen | held-out, real rounds (k = {K}) | held-out, every row | first draft (held-out) |",
         "|---|---|---|---|---|"]
for r in held:
    lines.append(f"| {r['step']} | {seen[r['step']]:,} | {r['accept_rounds']:.3f} | {r['accept']:.3f} | {r['pos1']:.3f} |")
people = {s: (a, f) for s, a, f in decoded["people"]}
lines += ["", "| steps | response tokens seen | built-in 24 (k = 4) | first draft | on-device people 48 (k = 4) | first draft |",
          "|---|---|---|---|---|---|"]
for step, acc, first in decoded["builtin"]:
    pa, pf = people.get(step, (float("nan"), float("nan")))
    lines.append(f"| {step} | {seen[step]:,} | {acc:.3f} | {first:.3f} | {pa:.3f} | {pf:.3f} |")
(out / "curve.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))

fig, ax = plt.subplots(figsize=(6.4, 4.0))
ax.plot([seen[r["step"]] / 1e6 for r in held], [r["accept_rounds"] for r in held], "o-",
        label=f"held-out, real rounds (k = {K})")
for name, label, mark in (("builtin", "built-in 24, decoded (k = 4)", "s-"), ("people", "on-device people 48, decoded (k = 4)", "^-")):
    ax.plot([seen[s] / 1e6 for s, _, _ in decoded[name]], [a for _, a, _ in decoded[name]], mark, label=label)
ax.set_xscale("log")
ax.set_xlabel("response tokens trained on (millions, one epoch, from scratch)")
ax.set_ylabel("tokens per target forward")
ax.set_title("SmolLM2-135M-Instruct head: acceptance vs data")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(out / "curve.png", dpi=120)
