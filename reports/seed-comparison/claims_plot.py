"""The published claims beside what the seed comparison measured (issue 47): one figure,
claims.png, from each baseline's three built-in runs' results.json (run.sh writes them; BASELINES
names their folders).

    python reports/seed-comparison/claims_plot.py [REPORT_DIR]

Panels: the head's speed over each draft model per category (each run a point, the published
>= 1.5x a line); tokens per verifying forward per category, head and draft models (the smart
replies' gain over the best baseline against the published "up to +55%"); drafter-owned memory
at 2,048 tokens of context (the published ~130 MB saving as the gap it claims).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

PUBLISHED_SPEEDUP = 1.5  # the head over a draft model of similar size, on every task
PUBLISHED_SMART_REPLY_GAIN = 0.55  # up to +55% acceptance on smart replies
PUBLISHED_MEMORY_SAVING_MB = 130.0  # per instance, on Gemini Nano


def summaries(res: dict) -> dict:
    return {(s["method"], s["category"]): s for s in res["summaries"]}


# Each baseline's three built-in runs: (label, folder pattern). A missing one is left out. The
# equal-budget runs pair the draft model with a head trained at its budget (train-head-equal.sh).
BASELINES = (("draft model 3.3M (EPYC)", "builtin-run*"),
             ("draft model 3.3M, equal budget (Xeon)", "builtin-equal-run*"),
             ("draft model 31.9M (Xeon)", "builtin-31m-run*"))


def main(out: Path) -> None:
    sets = [(label, [json.loads((d / "results.json").read_text()) for d in sorted(out.glob(pattern))])
            for label, pattern in BASELINES]
    sets = [(label, runs) for label, runs in sets if runs]
    if not sets:
        raise SystemExit(f"no built-in runs ({', '.join(p for _, p in BASELINES)}) under {out}")
    cats = sets[0][1][0]["categories"]
    fig, ax = plt.subplots(1, 3, figsize=(17, 5.2))
    width = 0.8 / len(sets)
    x = range(len(cats))
    for n, (_, runs) in enumerate(sets):
        s = [summaries(r) for r in runs]
        ratios = [[r[("mtp", c)]["tokens_per_s"] / r[("draft-model", c)]["tokens_per_s"] for r in s] for c in cats]
        pos = [i - 0.4 + width * (n + 0.5) for i in x]
        ax[0].bar(pos, [statistics.median(rs) for rs in ratios], width, alpha=0.35, color=f"C{n}")
        for p_, rs in zip(pos, ratios):
            ax[0].scatter([p_] * len(rs), rs, color=f"C{n}", s=12, zorder=3)
    ax[0].axhline(PUBLISHED_SPEEDUP, color="tab:red", ls="--")
    ax[0].axhline(1.0, color="grey", lw=0.8)
    ax[0].set_ylim(0, 2.4)
    ax[0].set_xticks(list(x), cats, rotation=30, ha="right")
    ax[0].set_ylabel("head tok/s / draft model tok/s, same run")
    ax[0].set_title("Speed, same loop and verify (3 runs each; bar = median;\nequal budget: the head trained as that baseline)")
    ax[0].legend([Patch(color=f"C{n}", alpha=0.35) for n in range(len(sets))] + [Line2D([], [], color="tab:red", ls="--")],
                 [f"over {label}" for label, _ in sets] + ["published: >= 1.5x"], fontsize=7, loc="upper left")

    bars = [("MTP head (k = 3)", [summaries(sets[0][1][0])[("mtp", c)]["mean_accepted"] for c in cats])]
    bars += [(label, [summaries(runs[0])[("draft-model", c)]["mean_accepted"] for c in cats]) for label, runs in sets]
    w = 0.8 / len(bars)
    for n, (label, vals) in enumerate(bars):
        ax[1].bar([i - 0.4 + w * (n + 0.5) for i in x], vals, w, label=label, color="tab:blue" if n == 0 else f"C{n - 1}",
                  alpha=1.0 if n == 0 else 0.6)
    j = cats.index("smart_reply")
    gains = [summaries(runs[0])[("mtp", cats[j])]["mean_accepted"] / summaries(runs[0])[("draft-model", cats[j])]["mean_accepted"]
             - 1 for _, runs in sets]  # each against the head of its own run
    text = "\n".join(f"+{g:.0%} over {label.replace('draft model ', '')}" for g, (label, _) in zip(gains, sets))
    ax[1].text(0.02, 0.97, f"smart replies, head over:\n{text}\n(published: up to +{PUBLISHED_SMART_REPLY_GAIN:.0%})",
               transform=ax[1].transAxes, va="top", fontsize=7)
    ax[1].set_ylim(0, max(max(v) for _, v in bars) * 1.6)
    ax[1].set_xticks(list(x), cats, rotation=30, ha="right")
    ax[1].set_ylabel("tokens per verifying forward")
    ax[1].set_title("Acceptance (run 1 of each; the head's bars: the shipped head's first run)")
    ax[1].legend(loc="upper right", fontsize=7)

    head_mb = sets[0][1][0]["memory"]["mtp"]["bytes_at_context"]["2048"] / 1e6
    names = ["MTP head"] + [label.replace("draft model ", "") for label, _ in sets] + ["published:\nhead + ~130 MB"]
    vals = [head_mb] + [runs[0]["memory"]["draft-model"]["bytes_at_context"]["2048"] / 1e6 for _, runs in sets]
    vals.append(head_mb + PUBLISHED_MEMORY_SAVING_MB)
    colors = ["tab:blue"] + [f"C{n}" for n in range(len(sets))] + ["tab:red"]
    ax[2].bar(range(len(vals)), vals, color=colors, alpha=0.7)
    for i, v in enumerate(vals):
        ax[2].annotate(f"{v:.1f} MB", (i, v), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax[2].set_xticks(range(len(vals)), names, rotation=20, ha="right", fontsize=7)
    ax[2].set_ylabel("MB the drafter owns (weights + own KV cache)")
    ax[2].set_title("Memory at 2,048 tokens of context\n(published: the head saves ~130 MB)")

    fig.suptitle("The MTP head against independent draft models (SmolLM2-135M, built-in set, bf16; "
                 "the baselines are less trained than the head, see README)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "claims.png", dpi=110)
    print(f"wrote {out / 'claims.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
