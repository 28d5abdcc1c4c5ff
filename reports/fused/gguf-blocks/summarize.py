"""Tables from the folders `fresh-clones.sh` writes: one row a run, then min / median / max.

    python reports/fused/gguf-blocks/summarize.py reports/fused/gguf-blocks/fresh-clones
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def overall(path: Path) -> dict[str, dict]:
    r = json.loads(path.read_text())
    return {s["method"]: s for s in r["summaries"] if s["category"] == "all"}


def verify_ratio(s: dict[str, dict], m: str) -> float:
    return s[m]["ms_per_forward"] / s["k0"]["ms_per_forward"]


def spread(xs: list[float], fmt: str = "{:.2f}x") -> str:
    return " / ".join(fmt.format(v) for v in (min(xs), statistics.median(xs), max(xs)))


def main(root: Path) -> None:
    runs = sorted(p for p in root.glob("run*") if p.is_dir())
    rows: dict[str, list] = {k: [] for k in ("main", "lc", "sb", "fp32", "costs", "gen")}
    for run in runs:
        m = overall(run / "main-results.json")
        rows["main"].append((m["hf"]["tokens_per_s"], m["k0"]["speedup_vs_hf"], m["k0"]["ms_per_forward"], m["mtp"]["speedup_vs_hf"],
                             m["mtp"]["speedup_vs_k0"], m["switch"]["speedup_vs_hf"], m["switch"]["speedup_vs_k0"],
                             m["mtp"]["mean_accepted"], m["switch"]["mean_accepted"], verify_ratio(m, "mtp"), verify_ratio(m, "switch"),
                             m["mtp"]["identical_k0"], m["switch"]["identical_k0"]))
        for key, folder in (("lc", "llamacpp-builtin"), ("sb", "llamacpp-specbench")):
            s = overall(run / folder / "results.json")
            lc = s["llamacpp"]["tokens_per_s"]
            rows[key].append((lc, s["llamacpp-lookup"]["tokens_per_s"] / lc, s["k0"]["tokens_per_s"] / lc,
                              s["mtp"]["tokens_per_s"] / lc, s["switch"]["tokens_per_s"] / lc,
                              s["mtp"]["mean_accepted"], verify_ratio(s, "mtp"), s["mtp"]["identical_k0"], s["switch"]["identical_k0"],
                              s["llamacpp-lookup"]["identical_llamacpp"], s["k0"]["prompts"]))
        f = overall(run / "fp32" / "results.json")
        old = overall(run / "old-k0" / "results.json")
        rows["fp32"].append((f["k0"]["tokens_per_s"], f["k0"]["identical"], old["k0"]["tokens_per_s"],
                             f["k0"]["tokens_per_s"] / old["k0"]["tokens_per_s"]))
        c = json.loads((run / "costs-gguf.json").read_text())
        d = json.loads((run / "costs-dense.json").read_text())
        rows["costs"].append((c["verify_ms"]["1"], c["memory"], d["verify_ms"]["1"], d["memory"]))
        gen = []
        for t in sorted(run.glob("generate-*.time")):
            txt = t.read_text()
            wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", txt)
            rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", txt)
            secs = int(wall.group(2)) * 60 + float(wall.group(3)) if wall else float("nan")
            gen.append((secs, int(rss.group(1)) / 1024 if rss else float("nan")))
        rows["gen"].append(gen)
    print(f"# {len(runs)} runs: {', '.join((r / 'commit.txt').read_text().splitlines()[0] for r in runs)}\n")
    print("## README main command (hf,k0,mtp,switch -n 80, --weights auto = gguf, bf16)")
    print("| run | HF tok/s | k0 x HF (ms/fwd) | head x HF | head x k0 | switch x HF | switch x k0 | tok/fwd (head, switch) "
          "| verify / 1-token (head, switch) | identical to k0 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows["main"], 1):
        print(f"| {i} | {r[0]:.1f} | {r[1]:.2f}x ({r[2]:.1f}) | {r[3]:.2f}x | {r[4]:.2f}x | {r[5]:.2f}x | {r[6]:.2f}x "
              f"| {r[7]:.2f}, {r[8]:.2f} | {r[9]:.2f}x, {r[10]:.2f}x | {r[11]}/24, {r[12]}/24 |")
    cols = list(zip(*rows["main"]))
    print(f"| min / median / max | | {spread(cols[1])} | {spread(cols[3])} | {spread(cols[4])} | {spread(cols[5])} "
          f"| {spread(cols[6])} | | | |")
    for key, name in (("lc", "built-in 24"), ("sb", "Spec-Bench 48")):
        print(f"\n## Against llama.cpp, {name} (k0,mtp,switch,llamacpp,llamacpp-lookup --weights gguf -n 80)")
        print("| run | llama.cpp greedy tok/s | lookup x llama.cpp | k0 x llama.cpp | head x llama.cpp | switch x llama.cpp "
              "| head tok/fwd | head verify / 1-token | identical to k0 (head, switch) | lookup identical to llama.cpp |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for i, r in enumerate(rows[key], 1):
            n = r[10]
            print(f"| {i} | {r[0]:.1f} | {r[1]:.2f}x | {r[2]:.2f}x | {r[3]:.2f}x | {r[4]:.2f}x | {r[5]:.2f} | {r[6]:.2f}x "
                  f"| {r[7]}/{n}, {r[8]}/{n} | {r[9]}/{n} |")
        cols = list(zip(*rows[key]))
        print(f"| min / median / max | | {spread(cols[1])} | {spread(cols[2])} | {spread(cols[3])} | {spread(cols[4])} | | | | |")
    print("\n## fp32 on GGUF blocks against HF fp32 greedy, and against 7213003's bf16 k0 (dense)")
    print("| run | fp32 k0 tok/s (gguf) | identical to HF fp32 | 7213003 bf16 k0 tok/s | ratio |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(rows["fp32"], 1):
        print(f"| {i} | {r[0]:.1f} | {r[1]}/24 | {r[2]:.1f} | {r[3]:.2f}x |")
    print("\n## mtpspec costs (bf16, 256 cached tokens): one-token forward beside bytes / bandwidth")
    print("| run | weights | one-token forward | MB per forward | bandwidth GB/s | bandwidth-limited | measured / limit |")
    print("|---|---|---|---|---|---|---|")
    for i, (g, gm, d, dm) in enumerate(rows["costs"], 1):
        for name, ms, mem in (("gguf", g, gm), ("dense", d, dm)):
            print(f"| {i} | {name} | {ms:.2f} ms | {mem['weight_bytes'] / 1e6:.0f} | {mem['bandwidth']['bytes_per_s'] / 1e9:.1f} "
                  f"| {mem['bandwidth_limit_ms']:.2f} ms | {mem['forward_over_limit']:.2f}x |")
    print("\n## Warm `mtpspec generate -n 8 --prompt hi` (three in a row; the first compiles and converts)")
    for i, g in enumerate(rows["gen"], 1):
        print(f"- run {i}: " + "; ".join(f"{s:.1f} s, peak RSS {m:.0f} MB" for s, m in g))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
