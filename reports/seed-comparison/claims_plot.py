"""The published claims beside what the seed comparison measured (issue 47): one figure,
claims.png, from the three built-in runs' results.json (run.sh writes them).

    python reports/seed-comparison/claims_plot.py [REPORT_DIR]

Panels: the head's speed over the draft model per category (each run a point, the published
>= 1.5x a line); tokens per verifying forward per category, head and draft model (the smart
replies' gain against the published "up to +55%"); drafter-owned memory at 2,048 tokens of
context (the published ~130 MB saving as the gap it claims).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PUBLISHED_SPEEDUP = 1.5  # the head over a draft model of similar size, on every task
PUBLISHED_SMART_REPLY_GAIN = 0.55  # up to +55% acceptance on smart replies
PUBLISHED_MEMORY_SAVING_MB = 130.0  # per instance, on Gemini Nano


def summaries(res: dict) -> dict:
    return {(s["method"], s["category"]): s for s in res["summaries"]}


def main(out: Path) -> None:
    runs = [json.loads((d / "results.json").read_text()) for d in sorted(out.glob("builtin-run*"))]
    if not runs:
        raise SystemExit(f"no builtin-run*/results.json under {out}")
    cats = runs[0]["categories"]
    s = [summaries(r) for r in runs]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))

    ratios = [[r[("mtp", c)]["tokens_per_s"] / r[("draft-model", c)]["tokens_per_s"] for r in s] for c in cats]
    for i, rs in enumerate(ratios):
        ax[0].scatter([i] * len(rs), rs, color="tab:blue", zorder=3)
        ax[0].bar(i, statistics.median(rs), color="tab:blue", alpha=0.3)
    ax[0].axhline(PUBLISHED_SPEEDUP, color="tab:red", ls="--", label="published: >= 1.5x")
    ax[0].axhline(1.0, color="grey", lw=0.8)
    ax[0].set_xticks(range(len(cats)), cats, rotation=30, ha="right")
    ax[0].set_ylabel("head tok/s / draft model tok/s")
    ax[0].set_title(f"Speed, same loop and verify ({len(runs)} runs; bar = median)")
    ax[0].legend()

    head = [s[0][("mtp", c)]["mean_accepted"] for c in cats]
    dm = [s[0][("draft-model", c)]["mean_accepted"] for c in cats]
    x = range(len(cats))
    ax[1].bar([i - 0.2 for i in x], head, 0.4, label="MTP head (k = 3)")
    ax[1].bar([i + 0.2 for i in x], dm, 0.4, label="draft model (k = 3)")
    j = cats.index("smart_reply")
    gain = head[j] / dm[j] - 1
    ax[1].annotate(f"+{gain:.0%} (published: up to +{PUBLISHED_SMART_REPLY_GAIN:.0%})", (j, head[j]),
                   xytext=(0, 8), textcoords="offset points", ha="center", fontsize=8)
    ax[1].set_ylim(0, max(head + dm) * 1.3)
    ax[1].set_xticks(list(x), cats, rotation=30, ha="right")
    ax[1].set_ylabel("tokens per verifying forward")
    ax[1].set_title("Acceptance")
    ax[1].legend(loc="upper left")

    mem = {m: runs[0]["memory"][m]["bytes_at_context"]["2048"] / 1e6 for m in ("mtp", "draft-model")}
    ax[2].bar(["MTP head", "draft model (3.3M)"], [mem["mtp"], mem["draft-model"]], color=["tab:blue", "tab:orange"])
    ax[2].bar(["published:\nhead + ~130 MB"], [mem["mtp"] + PUBLISHED_MEMORY_SAVING_MB], color="tab:red", alpha=0.4)
    for i, v in enumerate([mem["mtp"], mem["draft-model"], mem["mtp"] + PUBLISHED_MEMORY_SAVING_MB]):
        ax[2].annotate(f"{v:.1f} MB", (i, v), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax[2].set_ylabel("MB the drafter owns (weights + own KV cache)")
    ax[2].set_title("Memory at 2,048 tokens of context\n(published: the head saves ~130 MB)")

    fig.suptitle("The MTP head against an independent draft model (SmolLM2-135M, built-in set; "
                 "the baseline is far less trained, see README)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "claims.png", dpi=110)
    print(f"wrote {out / 'claims.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
