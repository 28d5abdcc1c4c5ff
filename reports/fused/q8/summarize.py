"""Tables from the folders `fresh-clones.sh` writes: one row a run, then min / median / max.

    python reports/fused/q8/summarize.py reports/fused/q8/fresh-clones
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path


def _sibling():
    """reports/fused/gguf-blocks/summarize.py, whose helpers read the same results.json"""
    path = Path(__file__).resolve().parents[1] / "gguf-blocks" / "summarize.py"
    spec = importlib.util.spec_from_file_location("gguf_blocks_summarize", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_G = _sibling()
overall, spread, verify_ratio = _G.overall, _G.spread, _G.verify_ratio

COSTS = re.compile(r"at ([\d.]+) GB/s .*= ([\d.]+) ms bandwidth limit; measured one-token forward ([\d.]+) ms = ([\d.]+)x the limit")
ROWS = re.compile(r"target forward over (\d) token\(s\):\s+([\d.]+) ms")


def costs(path: Path) -> tuple[float, float, float, float, dict[int, float]]:
    """(bandwidth GB/s, limit ms, one-token forward ms, forward / limit, {n: ms}) from `mtpspec costs`' output"""
    text = path.read_text()
    m = COSTS.search(text)
    assert m, f"no bandwidth line in {path}"
    return (*map(float, m.groups()), {int(n): float(ms) for n, ms in ROWS.findall(text)})  # type: ignore[return-value]


def main(root: Path) -> None:
    runs = sorted(p for p in root.glob("run*") if p.is_dir())
    print(f"# {len(runs)} runs: {', '.join((r / 'commit.txt').read_text().splitlines()[0] for r in runs)}\n")
    print("## README main command (hf,k0,mtp,switch -n 80; bf16, --weights auto = gguf)")
    print("| run | HF tok/s | k0 x HF (ms/fwd) | head x k0 | switch x k0 | tok/fwd (head, switch) | verify / 1-token (head, switch) "
          "| identical to k0 |")
    print("|---|---|---|---|---|---|---|---|")
    main_cols: list[list[float]] = [[], [], []]
    for i, run in enumerate(runs, 1):
        m = overall(run / "main-results.json")
        vals = (m["k0"]["speedup_vs_hf"], m["mtp"]["speedup_vs_k0"], m["switch"]["speedup_vs_k0"])
        for c, v in zip(main_cols, vals):
            c.append(v)
        print(f"| {i} | {m['hf']['tokens_per_s']:.1f} | {vals[0]:.2f}x ({m['k0']['ms_per_forward']:.1f}) | {vals[1]:.2f}x "
              f"| {vals[2]:.2f}x | {m['mtp']['mean_accepted']:.2f}, {m['switch']['mean_accepted']:.2f} "
              f"| {verify_ratio(m, 'mtp'):.2f}x, {verify_ratio(m, 'switch'):.2f}x "
              f"| {m['mtp']['identical_k0']}/24, {m['switch']['identical_k0']}/24 |")
    print(f"| min / median / max | | {spread(main_cols[0])} | {spread(main_cols[1])} | {spread(main_cols[2])} | | | |\n")
    print("## mtpspec costs (256 cached tokens): one-token forward beside 96 MB of weights / bandwidth")
    print("| run | bandwidth GB/s | limit | q8 forward | q8 / limit | q8 2, 3, 4 rows / 1 | bf16 forward | bf16 / limit |")
    print("|---|---|---|---|---|---|---|---|")
    q8s, bfs, ratios = [], [], []
    for i, run in enumerate(runs, 1):
        bw, lim, q8, q8r, rows = costs(run / "costs-q8.log")
        _, _, bf, bfr, _ = costs(run / "costs-bf16.log")
        q8s.append(q8r), bfs.append(bfr), ratios.append(bf / q8)
        rel = ", ".join(f"{rows[n] / rows[1]:.2f}" for n in (2, 3, 4))
        print(f"| {i} | {bw:.1f} | {lim:.2f} ms | {q8:.2f} ms | {q8r:.2f}x | {rel} | {bf:.2f} ms | {bfr:.2f}x |")
    print(f"| min / median / max | | | | {spread(q8s)} | | | {spread(bfs)} |")
    print(f"\nbf16 forward / q8 forward, same run: {spread(ratios)}")
    print("\n## q8 beside llama.cpp, built-in 24 (k0,mtp,switch,llamacpp,llamacpp-lookup --dtype q8 -n 80)")
    print("| run | llama.cpp greedy tok/s | lookup x llama.cpp | k0 tok/s | k0 x llama.cpp | head x llama.cpp | head x k0 "
          "| switch x k0 | head tok/fwd | verify / 1-token (head, switch) | identical to k0 (head, switch) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cols: list[list[float]] = [[], [], [], [], []]
    for i, run in enumerate(runs, 1):
        s = overall(run / "q8-builtin" / "results.json")
        lc, k0 = s["llamacpp"]["tokens_per_s"], s["k0"]["tokens_per_s"]
        vals = (s["llamacpp-lookup"]["tokens_per_s"] / lc, k0 / lc, s["mtp"]["tokens_per_s"] / lc,
                s["mtp"]["tokens_per_s"] / k0, s["switch"]["tokens_per_s"] / k0)
        for c, v in zip(cols, vals):
            c.append(v)
        n = s["k0"]["prompts"]
        print(f"| {i} | {lc:.1f} | {vals[0]:.2f}x | {k0:.1f} | {vals[1]:.2f}x | {vals[2]:.2f}x | {vals[3]:.2f}x | {vals[4]:.2f}x "
              f"| {s['mtp']['mean_accepted']:.2f} | {verify_ratio(s, 'mtp'):.2f}x, {verify_ratio(s, 'switch'):.2f}x "
              f"| {s['mtp']['identical_k0']}/{n}, {s['switch']['identical_k0']}/{n} |")
    print(f"| min / median / max | | {spread(cols[0])} | | {spread(cols[1])} | {spread(cols[2])} | {spread(cols[3])} "
          f"| {spread(cols[4])} | | | |")
    sb = [r / "q8-specbench" / "results.json" for r in runs if (r / "q8-specbench" / "results.json").is_file()]
    for path in sb:
        s = overall(path)
        lc, n = s["llamacpp"]["tokens_per_s"], s["k0"]["prompts"]
        print(f"\n## q8 on {n} Spec-Bench prompts ({path.parent.parent.name}): llama.cpp greedy {lc:.1f} tok/s; k0 "
              f"{s['k0']['tokens_per_s'] / lc:.2f}x llama.cpp, head {s['mtp']['tokens_per_s'] / lc:.2f}x "
              f"({s['mtp']['tokens_per_s'] / s['k0']['tokens_per_s']:.2f}x k0), switch "
              f"{s['switch']['tokens_per_s'] / lc:.2f}x ({s['switch']['tokens_per_s'] / s['k0']['tokens_per_s']:.2f}x k0); "
              f"identical to k0: head {s['mtp']['identical_k0']}/{n}, switch {s['switch']['identical_k0']}/{n}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
