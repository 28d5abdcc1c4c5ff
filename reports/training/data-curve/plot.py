"""Acceptance vs response tokens trained on: held-out (the run's metrics.jsonl, the split
`mtpspec train` makes) and decoded on the built-in set and the independent on-device set.
Each run is read from its folder under reports/ alone (metrics.jsonl, stepN-builtin.json,
stepN-people.json, stepend-*.json and seen.json), so the plot is remade without the run's
multi-GB activation cache.

seen.json holds the response tokens trained on at each step that has a point, counted exactly by
replaying the run's own batch order over its cache; `count` makes it while the cache exists:

    python reports/training/data-curve/plot.py count RUN_DIR REPORT_DIR      # e.g. runs/all5-e1 reports/training/data-curve/run-5m
    python reports/training/data-curve/plot.py OUT_DIR REPORT_DIR [REPORT_DIR ...]
    cd reports/training/data-curve && python plot.py . run run-full run-5m run-10m   # the curve as committed

Writes OUT_DIR/curve.md (one pair of tables per run) and OUT_DIR/curve.png: a bold line through
the runs' annealed ends (the curve), each run's earlier stops faint. The decoded sets are the same
prompts for every run; each run's held-out split is 4% of its own data.
"""
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETS = {"builtin": ("built-in 24", "s"), "people": ("on-device people 48", "^")}  # name -> (label, marker)


@dataclass(frozen=True)
class Run:
    name: str
    last: int  # the epoch's last step ("stepend")
    seen: dict[int, int]  # step -> response tokens trained on by then
    held: list[dict]  # metrics.jsonl rows with a held-out evaluation
    decoded: dict[str, dict[int, tuple[float, float]]]  # set -> step -> (tokens per forward, first draft)
    k: int  # the run's unrolled draft steps


def count(run: Path, report: Path) -> None:
    """Write report/seen.json: response tokens seen at every held-out or decoded step of the run."""
    from mtpspec.training.activations import Samples, load_cache
    from mtpspec.training.train import TrainConfig, epoch_batches, split

    cfg = TrainConfig(holdout=0.04, batch_size=16)  # the runs' split and batches (seed 0)
    train = Samples([])
    for d in sorted(run.glob("activations*"), key=lambda p: (len(p.name), p.name)):  # the trainer's --data order
        train = train + split(load_cache(d), cfg)[0]
    resp = [len(ids) - p for ids, p in train.tokens()]
    seen, total = [0], 0
    for batch in epoch_batches(len(train), cfg, 0):
        total += sum(resp[i] for i in batch)
        seen.append(total)
    wanted = {len(seen) - 1} | {h["step"] for h in held_rows(report)}
    wanted |= {int(f.name[4:].split("-")[0]) for f in report.glob("step[0-9]*-*.json")}
    out = {"last_step": len(seen) - 1, "seen": {str(s): seen[s] for s in sorted(wanted)}}
    (report / "seen.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{report / 'seen.json'}: {len(seen) - 1} steps, {seen[-1]:,} response tokens")


def held_rows(report: Path) -> list[dict]:
    return [json.loads(line) for line in (report / "metrics.jsonl").open() if "accept_rounds" in line]


def load_run(report: Path) -> Run:
    if not (report / "seen.json").is_file() or not (report / "metrics.jsonl").is_file():
        sys.exit(f"{report} lacks seen.json or metrics.jsonl: is it a run's report folder? "
                 f"(`plot.py count RUN_DIR {report}` writes seen.json while the run's cache exists)")
    counted = json.loads((report / "seen.json").read_text())
    last, seen = counted["last_step"], {int(s): n for s, n in counted["seen"].items()}
    held = held_rows(report)
    k = len([key for key in held[0] if key.startswith("pos")]) if held else 2
    decoded: dict[str, dict[int, tuple[float, float]]] = {}
    for name in SETS:
        decoded[name] = {}
        for f in report.glob(f"step*-{name}.json"):
            tag = f.name[4:-len(f"-{name}.json")]
            step = last if tag == "end" else int(tag)
            row = next(r for r in json.loads(f.read_text()) if r["category"] == "all")
            decoded[name][step] = (row["mean_accepted"], row["position_acceptance"][0])
    return Run(report.name, last, seen, held, decoded, k)


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


def plot(out: Path, runs: list[Run]) -> None:
    text = "\n".join(line for r in runs for line in tables(r))
    (out / "curve.md").write_text(text)
    print(text)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    measures = [("held-out, real rounds (k = 2; each run's own 4% split)", "o", "C0",
                 [{h["step"]: h["accept_rounds"] for h in r.held} for r in runs])]
    measures += [(f"{label}, decoded (k = 4)", marker, f"C{j + 1}",
                  [{s: v[0] for s, v in r.decoded[name].items()} for r in runs])
                 for j, (name, (label, marker)) in enumerate(SETS.items())]
    for label, marker, colour, per_run in measures:
        for r, points in zip(runs, per_run):  # faint: a run's stops, only the last one annealed
            steps = sorted(points)
            ax.plot([r.seen[s] / 1e6 for s in steps], [points[s] for s in steps], marker, ls="-", lw=0.8,
                    ms=3, alpha=0.35, color=colour)
        ends = sorted((r.seen[r.last] / 1e6, points[r.last]) for r, points in zip(runs, per_run) if r.last in points)
        ax.plot(*zip(*ends), marker, ls="-", lw=2, ms=7, color=colour, label=f"{label}, epoch's end")
    ax.plot([], [], "k-", lw=0.8, alpha=0.35, label="a run's earlier stops (learning rate not yet annealed)")
    ax.set_xscale("log")
    ticks = [0.1, 0.2, 0.5, 1, 2, 5]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("response tokens trained on (millions, one epoch, from scratch)")
    ax.set_ylabel("tokens per target forward")
    ax.set_title("SmolLM2-135M-Instruct head: acceptance vs data")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "count":
        count(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) >= 3:
        plot(Path(sys.argv[1]), [load_run(Path(p)) for p in sys.argv[2:]])
    else:
        sys.exit(__doc__)
