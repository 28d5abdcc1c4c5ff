"""Acceptance vs response tokens trained on, from runs of run.sh: held-out (metrics.jsonl, the
split `mtpspec train` makes) and decoded on the built-in set and the independent on-device set
(each stop's acceptance files).
Response tokens seen at step s are counted exactly, replaying each run's own batch order.

    python reports/data-curve/plot.py OUT_DIR RUN_DIR [RUN_DIR ...]
    python reports/data-curve/plot.py reports/data-curve runs/data-curve runs/data-full

Writes OUT_DIR/curve.md (one pair of tables per run) and OUT_DIR/curve.png (every run's points
on one set of axes: the decoded sets are the same prompts for every run; each run's held-out
split is 4% of its own data).
"""
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mtpspec.training.activations import Samples, load_cache  # noqa: E402
from mtpspec.training.train import TrainConfig, epoch_batches, split  # noqa: E402

SETS = {"builtin": ("built-in 24", "s"), "people": ("on-device people 48", "^")}  # name -> (label, marker)


@dataclass(frozen=True)
class Run:
    name: str
    seen: list[int]  # response tokens trained on after each step (seen[0] = 0)
    held: list[dict]  # metrics.jsonl rows with a held-out evaluation
    decoded: dict[str, dict[int, tuple[float, float]]]  # set -> step -> (tokens per forward, first draft)
    k: int  # the run's unrolled draft steps


def load_run(run: Path) -> Run:
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
    k = len([key for key in held[0] if key.startswith("pos")]) if held else 2
    decoded: dict[str, dict[int, tuple[float, float]]] = {}
    for name in SETS:
        decoded[name] = {}
        for f in run.glob(f"heads/step*/acceptance-{name}.json"):
            step = len(seen) - 1 if f.parent.name == "stepend" else int(f.parent.name[4:])  # "end": the epoch
            row = next(r for r in json.loads(f.read_text()) if r["category"] == "all")
            decoded[name][step] = (row["mean_accepted"], row["position_acceptance"][0])
    return Run(run.name, seen, held, decoded, k)


def tables(r: Run) -> list[str]:
    lines = [f"### {r.name}", "",
             f"| steps | response tokens seen | held-out, real rounds (k = {r.k}) | held-out, every row | first draft (held-out) |",
             "|---|---|---|---|---|"]
    lines += [f"| {h['step']} | {r.seen[h['step']]:,} | {h['accept_rounds']:.3f} | {h['accept']:.3f} | {h['pos1']:.3f} |"
              for h in r.held]
    lines += ["", "| steps | response tokens seen | built-in 24 (k = 4) | first draft | on-device people 48 (k = 4) | first draft |",
              "|---|---|---|---|---|---|"]
    nan = (float("nan"), float("nan"))
    for step in sorted(r.decoded["builtin"]):
        (ba, bf), (pa, pf) = r.decoded["builtin"][step], r.decoded["people"].get(step, nan)
        lines.append(f"| {step} | {r.seen[step]:,} | {ba:.3f} | {bf:.3f} | {pa:.3f} | {pf:.3f} |")
    return lines + [""]


out, runs = Path(sys.argv[1]), [load_run(Path(p)) for p in sys.argv[2:]]
text = "\n".join(line for r in runs for line in tables(r))
(out / "curve.md").write_text(text)
print(text)

fig, ax = plt.subplots(figsize=(6.4, 4.4))
for i, r in enumerate(runs):  # a colour per measure, a line style per run
    tag, style = (f" ({r.name})" if len(runs) > 1 else ""), ("-", "--", ":")[i % 3]
    ax.plot([r.seen[h["step"]] / 1e6 for h in r.held], [h["accept_rounds"] for h in r.held], "o", ls=style, color="C0",
            label=f"held-out, real rounds (k = {r.k}){tag}")
    for j, (name, (label, marker)) in enumerate(SETS.items()):
        steps = sorted(r.decoded[name])
        ax.plot([r.seen[s] / 1e6 for s in steps], [r.decoded[name][s][0] for s in steps], marker, ls=style,
                color=f"C{j + 1}", label=f"{label}, decoded (k = 4){tag}")
ax.set_xscale("log")
ticks = [0.1, 0.2, 0.5, 1, 2, 4]
ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
ax.set_xlabel("response tokens trained on (millions, one epoch, from scratch)")
ax.set_ylabel("tokens per target forward")
ax.set_title("SmolLM2-135M-Instruct head: acceptance vs data")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(out / "curve.png", dpi=120)
