"""The relaxed-acceptance sweep side by side: from the bench reports `run.sh` writes (one per
prompt set), a Markdown table per set (speed over k0, tokens per forward, share changed, edit
distance, the target's mean log-probability, the reference metrics), a table per Spec-Bench
category scored on references, and the plot speed against quality (trade.png).

    python reports/relaxed/summarize.py reports/relaxed/builtin reports/relaxed/specbench --out reports/relaxed
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure

REFERENCE = {"summarization": "rougeL", "translation": "chrF", "math_reasoning": "answer", "rag": "contains"}
NAMES = {"rougeL": "ROUGE-L", "chrF": "chrF", "answer": "answer match %", "contains": "answer contained %"}
RULE_STYLE = {"exact": ("black", "s"), "typical": ("tab:blue", "o"), "topm": ("tab:orange", "^"), "entropy": ("tab:green", "D")}


def load(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def summaries(res: dict, category: str = "all") -> dict[str, dict]:
    return {s["method"]: s for s in res["summaries"] if s["category"] == category}


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def overall_table(name: str, res: dict) -> list[str]:
    over = summaries(res)
    metrics = [m for m in NAMES if any(m in s["quality"] for s in over.values())]
    k0 = over["k0"]["quality"].get("logprob")
    lines = [f"### {name}: {over['k0']['prompts']} prompts, {res['config']['max_new_tokens']} new tokens", "",
             "| " + " | ".join(["rule", "tok/fwd", "x k0", "x mtp", "changed", "edit", "logprob", "d logprob",
                                *[NAMES[m] for m in metrics]]) + " |",
             "|" + "---|" * (8 + len(metrics))]
    mtp = over["mtp"]["tokens_per_s"]
    for m in res["methods"]:
        s = over[m]
        lp = s["quality"].get("logprob")
        rule = "k0 (plain)" if m == "k0" else s["acceptance"] if m != "mtp" else "exact (mtp)"
        cells = [rule, _f(s["mean_accepted"], ".2f"), _f(s["speedup_vs_k0"], ".2f") + "x", f"{s['tokens_per_s'] / mtp:.2f}x",
                 _f(s["changed_k0"], ".0%"), _f(s["edit_k0"], ".1f"), _f(lp, ".3f"),
                 _f(lp - k0 if lp is not None and k0 is not None else None, "+.3f")]
        cells += [_f(s["quality"].get(q), ".1f") for q in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def category_table(name: str, res: dict) -> list[str]:
    """Per category: speed over k0, share changed and the target's log-probability; the
    reference metric where the category has one."""
    lines = [f"### {name}, per category: x k0 / changed / d logprob (/ reference metric)", "",
             "| rule | " + " | ".join(res["categories"]) + " |", "|" + "---|" * (1 + len(res["categories"]))]
    by_cat = {c: summaries(res, c) for c in res["categories"]}
    for m in res["methods"]:
        row = [m if m in ("k0", "mtp") else by_cat[res["categories"][0]][m]["acceptance"]]
        for c in res["categories"]:
            s, k0 = by_cat[c][m], by_cat[c]["k0"]
            lp, lp0 = s["quality"].get("logprob"), k0["quality"].get("logprob")
            cell = f"{_f(s['speedup_vs_k0'], '.2f')}x / {_f(s['changed_k0'], '.0%')} / {_f(lp - lp0, '+.2f')}"
            q = REFERENCE.get(c)
            if q and q in s["quality"]:
                cell += f" / {s['quality'][q]:.1f}"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def reference_mean(s: dict) -> float | None:
    """Mean of the reference metrics a summary holds (each 0-100), one per scored category."""
    vals = [s["quality"][q] for q in REFERENCE.values() if q in s["quality"]]
    return sum(vals) / len(vals) if vals else None


def plot(sets: list[tuple[str, dict]], path: Path) -> None:
    """Speed over k0 against the target's mean log-probability (each set), the share of outputs
    changed, and Spec-Bench's mean reference score; one line per rule through its sweep."""
    fig = Figure(figsize=(13, 8.5), layout="constrained")
    axes = fig.subplots(2, 2)
    panels = [(axes[0][i], name, res, "logprob") for i, (name, res) in enumerate(sets[:2])]
    panels += [(axes[1][0], sets[0][0], sets[0][1], "changed")]
    panels += [(axes[1][1], sets[-1][0], sets[-1][1], "reference")]
    for ax, name, res, what in panels:
        over = summaries(res)
        groups: dict[str, list[tuple[float, float, str]]] = {}
        for m in res["methods"]:
            s = over[m]
            rule = s["acceptance"].split(":")[0]
            y = {"logprob": s["quality"].get("logprob"), "changed": 100 * (s["changed_k0"] or 0.0),
                 "reference": reference_mean(s)}[what]
            if y is not None:
                groups.setdefault(rule if m != "k0" else "k0", []).append((s["speedup_vs_k0"], y, s["acceptance"] if m != "k0" else "k0"))
        for rule, pts in groups.items():
            color, marker = RULE_STYLE.get(rule, ("grey", "x"))
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=rule,
                    linestyle="-" if rule in ("typical", "topm", "entropy") else "none")
            for x, y, label in pts:
                ax.annotate(label.split(":", 1)[-1] if rule != "k0" else "k0", (x, y), fontsize=7,
                            textcoords="offset points", xytext=(4, 3))
        ax.set_xlabel("speed over k0 (tok/s ratio, same run)")
        ax.set_ylabel({"logprob": "target's mean log-prob of the output (nats/token)",
                       "changed": "outputs that differ from k0 (%)",
                       "reference": "mean reference score (ROUGE-L, chrF, answer %, contained %)"}[what])
        ax.set_title(f"{name}: {what}")
        ax.grid(alpha=0.3)
        if groups:
            ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path, help="bench report folders (built-in first, Spec-Bench last)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sets = [(folder.name, load(folder)) for folder in args.reports]
    lines = ["# Relaxed acceptance sweep (generated by summarize.py)", ""]
    for name, res in sets:
        lines += overall_table(name, res) + [""]
    for name, res in sets:
        lines += category_table(name, res) + [""]
    lines += ["![speed against quality](trade.png)", ""]
    (args.out / "tables.md").write_text("\n".join(lines))
    plot(sets, args.out / "trade.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
