"""Writing a `BenchResult` out: results.json (everything), results.md (tables) and three PNG
plots: speed-up per category per method, acceptance by draft position, drafter-owned memory
against context length. Plots use matplotlib's `Figure` directly, which renders PNGs with the
Agg canvas and leaves pyplot's global state (and any interactive backend) untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .bench import ALL, BenchResult, Summary

SPEEDUP_PNG = "speedup.png"
ACCEPTANCE_PNG = "acceptance.png"
MEMORY_PNG = "memory.png"


def write_report(result: BenchResult, out_dir: str | Path) -> list[Path]:
    """Write results.json, results.md and the plots into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md", out / SPEEDUP_PNG, out / ACCEPTANCE_PNG, out / MEMORY_PNG]
    paths[0].write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    paths[1].write_text(markdown(result))
    plot_speedup(result, paths[2])
    plot_acceptance(result, paths[3])
    plot_memory(result, paths[4])
    return paths


# -- Markdown ---------------------------------------------------------------------------------
def _f(x: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{suffix}"


def _mib(n: int) -> str:
    return "0" if n == 0 else f"{n / 2**20:.2f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(result: BenchResult) -> str:
    cfg, info = result.config, result.info
    lines = ["# mtpspec bench", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += [f"- prompts: {len({r.question_id for r in result.records})} in {len(result.categories)} categories, "
              f"{cfg.reps} rep(s), warm-up {cfg.warmup} prompt(s), max_new_tokens {cfg.max_new_tokens}",
              f"- peak process memory (ru_maxrss): {_mib(result.peak_rss_bytes)}"]
    if result.best_k is not None:
        lines.append(f"- fastest MTP draft length: k = {result.best_k}")
    if result.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in result.notes]

    ctx = cfg.contexts
    lines += ["", "## Overall", "",
              "tok/s = total new tokens / total wall time; speed-ups are ratios of tok/s from this run. "
              "accepted/fwd: tokens per target forward that verifies drafts. fwd/token: all target forwards "
              "(prefill included) per new token. CPU ms/token: process CPU time (every thread) per new token; with "
              "fwd/token, the energy proxy. ms/verify fwd: mean wall time of one target forward in mtpspec's loop "
              "(k0: one token; a drafting method: k + 1 tokens or tree nodes), so their ratio is this run's verify "
              "cost. identical to k0: the exactness guarantee (same dtype, same library). identical to llamacpp: "
              "outputs equal to llama.cpp's own greedy decoding (its batched verify may round otherwise). TTFT includes any draft "
              "model prefill. Memory: what the drafter "
              "owns beside the target (weights + its own KV cache) at each context length.", ""]
    header = ["method", "k", "tok/s", "x hf", "x k0", "accepted/fwd", "fwd/token", "ms/verify fwd", "ms drafting/round",
              "TTFT ms", "CPU ms/token", "identical to hf", "identical to k0", "identical to llamacpp"]
    header += [f"drafter mem @{c}" for c in ctx]
    rows = []
    for m in result.methods:
        s = result.summary(m)
        rows.append([m, _f(result.method_k[m], "d"), _f(s.tokens_per_s, ".1f"), _f(s.speedup_vs_hf, ".2f", "x"),
                     _f(s.speedup_vs_k0, ".2f", "x"), _f(s.mean_accepted), _f(s.forwards_per_token, ".3f"),
                     _f(s.ms_per_forward, ".1f"), _f(s.ms_per_draft, ".2f"),
                     _f(s.ttft_s * 1e3 if s.ttft_s is not None else None, ".1f"),
                     _f(s.cpu_s_per_token * 1e3 if s.cpu_s_per_token is not None else None, ".1f"), _identical(s),
                     "-" if s.identical_k0 is None else f"{s.identical_k0}/{s.prompts}",
                     "-" if s.identical_llamacpp is None else f"{s.identical_llamacpp}/{s.prompts}"]
                    + [_mib(result.memory[m].at(c)) for c in ctx])
    lines += _table(header, rows)

    lines += ["", "## Per category", "", "tok/s (speed-up over hf), outputs identical to hf / to k0", ""]
    rows = []
    for m in result.methods:
        row = [m]
        for c in result.categories:
            s = result.summary(m, c)
            k0 = "-" if s.identical_k0 is None else f"{s.identical_k0}/{s.prompts}"
            row.append(f"{s.tokens_per_s:.1f} ({_f(s.speedup_vs_hf, '.2f', 'x')}), {_identical(s)} / {k0}")
        rows.append(row)
    lines += _table(["method", *result.categories], rows)
    lines += ["", "Per category: speed-up over k0, accepted tokens per verifying forward, TTFT ms, CPU ms per token", ""]
    rows = []
    for m in result.methods:
        row = [m]
        for c in result.categories:
            s = result.summary(m, c)
            row.append(f"{_f(s.speedup_vs_k0, '.2f', 'x')}, {_f(s.mean_accepted)}, "
                       f"{_f(s.ttft_s * 1e3 if s.ttft_s is not None else None, '.0f')}, "
                       f"{_f(s.cpu_s_per_token * 1e3 if s.cpu_s_per_token is not None else None, '.1f')}")
        rows.append(row)
    lines += _table(["method", *result.categories], rows)

    lines += quality_markdown(result)

    accept = [(m, result.summary(m).position_acceptance) for m in result.methods]
    accept = [(m, a) for m, a in accept if a]
    if accept:
        width = max(len(a) for _, a in accept)
        lines += ["", "## Acceptance by draft position", "",
                  "Rate at which draft position i was accepted, over rounds that reached it.", ""]
        lines += _table(["method", *[str(i + 1) for i in range(width)]],
                        [[m] + [f"{x:.3f}" for x in a] + [""] * (width - len(a)) for m, a in accept])
    lines += ["", f"![speed-up]({SPEEDUP_PNG})", "", f"![acceptance]({ACCEPTANCE_PNG})", "",
              f"![memory]({MEMORY_PNG})", ""]
    return "\n".join(lines)


def summary_line(result: BenchResult, method: str) -> str:
    """One console line for a method: speed, speed-ups, acceptance and exactness."""
    s = result.summary(method)
    parts = [f"{method:>11}  {s.tokens_per_s:6.1f} tok/s"]
    parts.append(f"{s.speedup_vs_hf:5.2f}x hf" if s.speedup_vs_hf is not None else " " * 8)
    parts.append(f"{s.speedup_vs_k0:5.2f}x k0" if s.speedup_vs_k0 is not None else " " * 8)
    if s.mean_accepted is not None:
        parts.append(f"{s.mean_accepted:4.2f} tok/fwd")
    if s.identical is not None:
        parts.append(f"identical to hf {s.identical}/{s.prompts}")
    if s.identical_k0 is not None:
        parts.append(f"to k0 {s.identical_k0}/{s.prompts}")
    if s.identical_llamacpp is not None and method.startswith("llamacpp") and method != "llamacpp":
        parts.append(f"to llamacpp {s.identical_llamacpp}/{s.prompts}")
    return "  ".join(parts)


REFERENCE_NAMES = {"rougeL": "ROUGE-L", "chrF": "chrF", "answer": "answer match %", "contains": "answer contained %"}


def _metrics(result: BenchResult) -> list[str]:
    """The reference metrics some output of this run was scored on, in REFERENCE_NAMES' order."""
    seen = {k for s in result.summaries for k in s.quality}
    return [m for m in REFERENCE_NAMES if m in seen]


def _has_quality(result: BenchResult) -> bool:
    return any(s.quality or s.edit_k0 is not None for s in result.summaries)


def _quality_cells(s: Summary, metrics: list[str]) -> list[str]:
    """changed vs k0, mean edit distance, mean log-probability, then each reference metric."""
    changed = "-" if s.changed_k0 is None else f"{s.changed_k0:.0%}"
    return [changed, _f(s.edit_k0, ".1f"), _f(s.quality.get("logprob"), ".3f")] + [_f(s.quality.get(m), ".1f") for m in metrics]


def quality_markdown(result: BenchResult) -> list[str]:
    """The quality tables: overall and per category, beside speed and tokens per forward."""
    if not _has_quality(result):
        return []
    metrics = _metrics(result)
    lines = ["", "## Quality", "",
             "What each output is worth, beside what it cost. rule: the acceptance rule (exact: the target's own "
             "output; a relaxed rule's output is not). changed: share of prompts whose output differs from k0's (plain "
             "decoding). edit: mean token edit distance to k0's output. logprob: the target's own mean log-probability "
             "of the output (nats per token; exact greedy output is its likeliest path token by token). Reference "
             "metrics (0-100) where the prompts have references: " + ", ".join(
                 f"{REFERENCE_NAMES[m]} ({c})" for c, m in (("summarization", "rougeL"), ("translation", "chrF"),
                                                           ("math_reasoning", "answer"), ("rag", "contains"))
                 if m in metrics) + ("." if metrics else "none in this run."), ""]
    header = ["method", "rule", "tok/fwd", "x k0", "changed", "edit", "logprob", *[REFERENCE_NAMES[m] for m in metrics]]
    rows = []
    for m in result.methods:
        s = result.summary(m)
        rows.append([m, s.acceptance or "-", _f(s.mean_accepted), _f(s.speedup_vs_k0, ".2f", "x"), *_quality_cells(s, metrics)])
    lines += _table(header, rows)
    lines += ["", "Per category: x k0, changed, edit, logprob, and the category's reference metric where it has one.", ""]
    rows = []
    for m in result.methods:
        row = [m]
        for c in result.categories:
            s = result.summary(m, c)
            cells = [_f(s.speedup_vs_k0, ".2f", "x"), *_quality_cells(s, [])]
            cells += [f"{REFERENCE_NAMES[q]} {s.quality[q]:.1f}" for q in metrics if q in s.quality]
            row.append(", ".join(cells))
        rows.append(row)
    lines += _table(["method", *result.categories], rows)
    return lines


def quality_lines(result: BenchResult) -> list[str]:
    """Console lines: each method's rule, share changed against k0, edit distance, the target's
    mean log-probability and the reference metrics, overall."""
    if not _has_quality(result):
        return []
    metrics = _metrics(result)
    lines = ["quality: rule, outputs changed vs k0, mean token edit distance, target's mean log-prob (nats/token)"
             + (", " + ", ".join(REFERENCE_NAMES[m] for m in metrics) if metrics else "")]
    for m in result.methods:
        s = result.summary(m)
        changed, edit, logprob, *refs = _quality_cells(s, metrics)
        ref = "".join(f"  {REFERENCE_NAMES[q]} {v}" for q, v in zip(metrics, refs))
        lines.append(f"{m:>11}  {s.acceptance or '-':<16} changed {changed:>4}  edit {edit:>5}  logprob {logprob:>6}{ref}")
    return lines


def verify_cost_line(result: BenchResult) -> str | None:
    """This run's cost of a verify forward over k + 1 tokens (or tree nodes) relative to k0's
    one-token forward, for each drafting method: what the speed-up had to pay for."""
    if "k0" not in result.methods or result.summary("k0").ms_per_forward is None:
        return None
    one = result.summary("k0").ms_per_forward
    costs = [f"{m} {result.summary(m).ms_per_forward / one:.2f}x" for m in result.methods
             if m != "k0" and result.summary(m).ms_per_forward is not None]
    return (f"verify forward cost in this run, relative to k0's one-token forward ({one:.1f} ms): " + ", ".join(costs)
            if costs else None)


def _identical(s: Summary) -> str:
    return "-" if s.identical is None else f"{s.identical}/{s.prompts}"


# -- plots ------------------------------------------------------------------------------------
def _figure(width: float = 8.0, height: float = 4.5) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def plot_speedup(result: BenchResult, path: Path) -> None:
    """Grouped bars: for each category (and overall), each method's speed-up over hf
    (over k0 when hf was not run)."""
    fig, ax = _figure(max(8.0, 1.4 * (len(result.categories) + 1)))
    base = "hf" if "hf" in result.methods else "k0" if "k0" in result.methods else None
    shown = [m for m in result.methods if m != base]
    if base is None or not shown:
        _empty(ax, "speed-up needs hf or k0 and at least one other method")
    else:
        cats = [*result.categories, ALL]
        width = 0.8 / len(shown)
        for i, m in enumerate(shown):
            ys = [getattr(result.summary(m, c), f"speedup_vs_{base}") or 0.0 for c in cats]
            ax.bar([x + (i - (len(shown) - 1) / 2) * width for x in range(len(cats))], ys, width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right")
        ax.set_ylabel(f"speed-up over {base} (tok/s ratio)")
        ax.legend(fontsize="small")
    ax.set_title("Speed-up per category")
    fig.savefig(path, dpi=120)


def plot_acceptance(result: BenchResult, path: Path) -> None:
    """Acceptance rate by draft position, one line per MTP method."""
    fig, ax = _figure()
    lines = [(m, result.summary(m).position_acceptance) for m in result.methods]
    lines = [(m, a) for m, a in lines if a]
    if not lines:
        _empty(ax, "no MTP method was run")
    for m, a in lines:
        ax.plot(range(1, len(a) + 1), a, marker="o", label=m)
    if lines:
        width = max(len(a) for _, a in lines)
        ax.set_xticks(range(1, width + 1))
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate (given reached)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize="small")
    ax.set_title("Acceptance by draft position")
    fig.savefig(path, dpi=120)


def plot_memory(result: BenchResult, path: Path) -> None:
    """Drafter-owned bytes against context length, one line per distinct drafter (methods that
    share one, like hf/k0/lookup with none or the MTP methods with one head, share a line)."""
    fig, ax = _figure()
    ctx = list(result.config.contexts)
    groups: dict[Any, list[str]] = {}
    for m in result.methods:
        groups.setdefault(result.memory[m], []).append(m)
    for mem, names in groups.items():
        ax.plot(ctx, [mem.at(c) / 2**20 for c in ctx], marker="o", label=", ".join(names))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ctx, [str(c) for c in ctx])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("drafter-owned memory (MiB)")
    ax.set_title("Drafter memory vs context length")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
