"""The seed comparison's tables from its bench runs' results.json files (run.sh writes them):
per run, per category, the head (mtp) against the draft model (draft-model), k0 beside.
    python reports/seed-comparison/summarize.py REPORT_DIR
"""

import json
import sys
from pathlib import Path


def load(d: Path) -> dict:
    return json.loads((d / "results.json").read_text())


def summaries(res: dict) -> dict:
    return {(s["method"], s["category"]): s for s in res["summaries"]}


def per_category(name: str, res: dict) -> list[str]:
    s = summaries(res)
    cats = ["all", *res["categories"]]
    lines = [f"### {name}", "", "| category | mtp x k0 | draft-model x k0 | mtp / draft-model | accepted/fwd mtp, dm "
             "| TTFT ms k0, mtp, dm | CPU ms/token k0, mtp, dm | fwd/token mtp, dm | identical to k0 mtp, dm |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cats:
        k0, m, d = s[("k0", c)], s[("mtp", c)], s[("draft-model", c)]
        lines.append(
            f"| {c} | {m['speedup_vs_k0']:.2f}x | {d['speedup_vs_k0']:.2f}x | {m['tokens_per_s'] / d['tokens_per_s']:.2f}x "
            f"| {m['mean_accepted']:.2f}, {d['mean_accepted']:.2f} "
            f"| {1e3 * k0['ttft_s']:.0f}, {1e3 * m['ttft_s']:.0f}, {1e3 * d['ttft_s']:.0f} "
            f"| {1e3 * k0['cpu_s_per_token']:.1f}, {1e3 * m['cpu_s_per_token']:.1f}, {1e3 * d['cpu_s_per_token']:.1f} "
            f"| {m['forwards_per_token']:.3f}, {d['forwards_per_token']:.3f} "
            f"| {m['identical_k0']}/{m['prompts']}, {d['identical_k0']}/{d['prompts']} |")
    pos = {m: s[(m, "all")]["position_acceptance"] for m in ("mtp", "draft-model")}
    lines += ["", "Acceptance by draft position (given reached): "
              + "; ".join(f"{m} {', '.join(f'{x:.2f}' for x in a)}" for m, a in pos.items()),
              "", "Drafter-owned memory (weights + its own KV cache) at 512 / 2,048 / 8,192 tokens of context: "
              + "; ".join(f"{m} " + " / ".join(f"{v / 1e6:.2f} MB" for v in res["memory"][m]["bytes_at_context"].values())
                          for m in ("mtp", "draft-model")), ""]
    return lines


def main(out: Path) -> None:
    runs = sorted(p.parent for p in out.glob("*/results.json"))
    for d in runs:
        print("\n".join(per_category(d.name, load(d))))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
