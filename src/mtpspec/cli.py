"""The `mtpspec` command line: parses arguments, calls the library, prints. Nothing more.

A user's mistake (an `MtpspecError`) becomes one line on stderr and exit status 2."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from .errors import MtpspecError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
F = TypeVar("F", bound=Callable[..., Any])


@app.callback()
def _root() -> None:
    """mtpspec: faster exact decoding for a frozen causal LM with a zero-copy MTP head."""


def user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MtpspecError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _read_json(path: Path) -> Any:
    from .errors import InputError

    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path} does not exist.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is not valid JSON ({e}).") from None


def load_head(target: Any, target_name: str, head: Path | None, fresh: bool, warn: Callable[[str], None]) -> Any:
    """The head to draft with: --head, else the head shipped for the embedded default, else a
    freshly initialised one (with a warning: it will accept almost nothing)."""
    from .core.head import MTPHead
    from .pretrained import shipped_head_dir

    if head is not None:
        return MTPHead.from_pretrained(head, target)
    shipped = shipped_head_dir(target_name)
    if shipped is not None and not fresh:
        return MTPHead.from_pretrained(shipped, target)
    warn("warning: no trained head for this target; using a freshly initialised head, which accepts "
         "few drafts. Train one with `mtpspec data` and `mtpspec train`, then pass --head DIR.")
    return MTPHead.for_target(target)


@app.command()
@user_errors
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="User message; the chat template is applied."),
    target: str = typer.Option(None, "--target", "-t", help="Local model dir or .gguf file [default: embedded SmolLM2-135M-Instruct]."),
    head: Path = typer.Option(None, "--head", help="Saved head directory [default: the shipped head for the target]."),
    fresh_head: bool = typer.Option(False, "--fresh-head", help="Ignore any shipped head; use an untrained one."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    num_draft_tokens: int = typer.Option(None, "--num-draft-tokens", "-k",
                                         help="Drafts per round [default: the head's tuned k]; 0 = plain decoding."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    top_p: float = typer.Option(1.0, "--top-p", help="1.0 = off."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling (reproducible output)."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    compare: bool = typer.Option(False, "--compare", help="Also decode plainly (k=0) and print both speeds side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
) -> None:
    """Generate text from a prompt with speculative decoding, streaming tokens as accepted."""
    from .core.decode import generate as run
    from .pretrained import default_k
    from .models import chat_ids, load_target
    from .core.target import Target

    loaded = load_target(target, dtype)
    tgt = Target(loaded.model)
    mtp = load_head(tgt, loaded.name, head, fresh_head, lambda m: typer.echo(m, err=True))
    k = default_k(mtp) if num_draft_tokens is None else num_draft_tokens
    ids = chat_ids(loaded.tokenizer, prompt)
    tok = loaded.tokenizer
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    stream = None
    if not as_json:
        shown: list[int] = []
        printed = [""]

        def stream(new: list[int]) -> None:
            shown.extend(new)
            text = tok.decode(shown, skip_special_tokens=True)
            sys.stdout.write(text[len(printed[0]):])
            sys.stdout.flush()
            printed[0] = text

    if compare:  # warm both paths up first, so that neither timing pays for first-call setup
        run(tgt, mtp, ids, num_draft_tokens=k, **{**kw, "max_new_tokens": 8})
        run(tgt, None, ids, num_draft_tokens=0, **{**kw, "max_new_tokens": 8})
    out = run(tgt, mtp, ids, num_draft_tokens=k, on_tokens=stream, **kw)
    new_ids = out.sequences[0, ids.shape[1]:].tolist()
    s = out.stats
    plain = run(tgt, None, ids, num_draft_tokens=0, **kw) if compare else None
    if as_json:
        obj: dict[str, Any] = {
            "text": tok.decode(new_ids, skip_special_tokens=True),
            "token_ids": new_ids,
            "num_draft_tokens": k,
            "stats": s.to_dict(),
        }
        if plain is not None:
            obj["plain"] = {"identical": plain.sequences.tolist() == out.sequences.tolist(), "stats": plain.stats.to_dict()}
        typer.echo(json.dumps(obj))
        return
    typer.echo("")
    line = (f"[{s.new_tokens} tokens, {s.new_tokens / s.total_s:.1f} tok/s, k={k}, "
            f"{s.mean_accepted:.2f} tokens per target forward, {s.target_forwards} target forwards]")
    if plain is not None:
        p = plain.stats
        same = "identical" if plain.sequences.tolist() == out.sequences.tolist() else "DIFFERENT"
        line += (f"\n[plain decoding: {p.new_tokens / p.total_s:.1f} tok/s; with the head: "
                 f"{(s.new_tokens / s.total_s) / (p.new_tokens / p.total_s):.2f}x; outputs {same}]")
    typer.echo(line, err=False)


@app.command()
@user_errors
def data(
    out: Path = typer.Option(..., "--out", "-o", help="Output directory (resumes if it holds a partial run)."),
    target: str = typer.Option(None, "--target", "-t", help="Local model dir or .gguf [default: embedded SmolLM2]."),
    num_samples: int = typer.Option(2000, "--num-samples"),
    batch_size: int = typer.Option(32, "--batch-size"),
    max_prompt_tokens: int = typer.Option(96, "--max-prompt-tokens"),
    max_response_tokens: int = typer.Option(256, "--max-response-tokens"),
    prompt_temperature: float = typer.Option(1.0, "--prompt-temperature"),
    response_temperature: float = typer.Option(0.0, "--response-temperature", help="0 = greedy responses."),
    task_share: float = typer.Option(0.8, "--task-share", help="Share of user turns seeded with an on-device task opener."),
    prompts_file: str = typer.Option(None, "--prompts-file", help="Extra prompts: .jsonl or .txt."),
    corpus: str = typer.Option(None, "--corpus", help="Extra raw-text corpus (plain text)."),
    seed: int = typer.Option(0, "--seed"),
    dtype: str = typer.Option("bf16", "--dtype", help="Generation dtype: bf16 (fast batched on modern CPUs) or fp32."),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch default)."),
) -> None:
    """Write self-distillation data: the target's own prompts and responses, as token shards."""
    import torch

    from .training.data import DataConfig, generate_data
    from .models import load_target

    if threads:
        torch.set_num_threads(threads)
    cfg = DataConfig(num_samples=num_samples, batch_size=batch_size, max_prompt_tokens=max_prompt_tokens,
                     max_response_tokens=max_response_tokens, prompt_temperature=prompt_temperature,
                     response_temperature=response_temperature, task_share=task_share, seed=seed)
    loaded = load_target(target, dtype)
    m = generate_data(loaded.model, loaded.tokenizer, out, cfg, prompts_file, corpus)
    typer.echo(f"{m['num_samples']} samples, {m['num_tokens']} tokens in {m['num_shards']} shards at {out}")


@app.command()
@user_errors
def train(
    data_dirs: list[Path] = typer.Option(..., "--data", "-d", help="Directory written by `mtpspec data`; repeat to train on several."),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory: activations/ (activations-1/, ... for further data sets), "
                             "checkpoint.pt, metrics.jsonl, head/."),
    target: str = typer.Option(None, "--target", "-t", help="Local model dir or .gguf [default: embedded SmolLM2]."),
    drafter: str = typer.Option("mtp", "--drafter", help="mtp (the head) or independent (baseline draft LM)."),
    num_steps: int = typer.Option(5, "--num-steps", help="Draft steps unrolled in training."),
    epochs: int = typer.Option(2, "--epochs"),
    batch_size: int = typer.Option(16, "--batch-size"),
    lr: float = typer.Option(1e-3, "--lr"),
    warmup_steps: int = typer.Option(50, "--warmup-steps"),
    weight_decay: float = typer.Option(0.0, "--weight-decay"),
    clip: float = typer.Option(1.0, "--clip"),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 autocast for the drafter's training."),
    holdout: float = typer.Option(0.05, "--holdout"),
    eval_every: int = typer.Option(50, "--eval-every"),
    save_every: int = typer.Option(50, "--save-every"),
    label_weight: float = typer.Option(0.1, "--label-weight"),
    feature_weight: float = typer.Option(1.0, "--feature-weight", help="Weight of the EAGLE-style feature loss."),
    step_decay: float = typer.Option(1.0, "--step-decay", help="Loss weight of draft step j is step_decay**j."),
    init_head: Path = typer.Option(None, "--init-head", help="Continue training this saved head (its architecture and "
                                   "draft vocabulary are kept; the architecture flags below are then ignored)."),
    indep_hidden: int = typer.Option(64, "--indep-hidden"),
    indep_layers: int = typer.Option(2, "--indep-layers"),
    seed: int = typer.Option(0, "--seed"),
    hidden_layers: str = typer.Option("-1", "--hidden-layers", help="Comma-separated target layers the head reads."),
    kv_layer: int = typer.Option(-1, "--kv-layer"),
    num_blocks: int = typer.Option(1, "--num-blocks"),
    mlp_ratio: float = typer.Option(2.0, "--mlp-ratio"),
    draft_vocab_size: int = typer.Option(0, "--draft-vocab-size", help="0 = full vocabulary."),
    teacher_topk: int = typer.Option(32, "--teacher-topk", help="Teacher log-probs kept per position."),
    cache_dtype: str = typer.Option("bf16", "--cache-dtype", help="dtype of the one target pass that caches activations."),
    resume: bool = typer.Option(False, "--resume", help="Continue from out/checkpoint.pt."),
    max_steps: int = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps (time-boxing)."),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch default)."),
) -> None:
    """Train a drafter on the target's cached activations (the target stays frozen)."""
    import torch
    import torch.distributed as dist

    from .training.activations import build_cache
    from .config import HeadConfig, TrainConfig
    from .core.head import saved_head_config
    from .models import load_target
    from .core.target import Target
    from .training.train import init_distributed
    from .training.train import train as run_train

    if threads:
        torch.set_num_threads(threads)
    cfg = TrainConfig(drafter=drafter, num_steps=num_steps, epochs=epochs, batch_size=batch_size, lr=lr,
                      warmup_steps=warmup_steps, weight_decay=weight_decay, clip=clip, bf16=bf16, holdout=holdout,
                      eval_every=eval_every, save_every=save_every, label_weight=label_weight, feature_weight=feature_weight,
                      step_decay=step_decay, indep_hidden=indep_hidden, indep_layers=indep_layers, seed=seed)
    try:
        layers = tuple(int(x) for x in hidden_layers.split(","))
    except ValueError:
        raise typer.BadParameter(f"--hidden-layers must be comma-separated integers, got {hidden_layers!r}") from None
    # continuing a saved head: its architecture decides what the activation cache holds
    hc = saved_head_config(init_head) if init_head is not None else HeadConfig(
        hidden_layers=layers, kv_layer=kv_layer, num_blocks=num_blocks, mlp_ratio=mlp_ratio,
        draft_vocab_size=draft_vocab_size, max_draft_tokens=num_steps)
    rank, world = init_distributed()
    cache_dirs = [out / ("activations" if i == 0 else f"activations-{i}") for i in range(len(data_dirs))]
    if rank == 0:  # one pass of the target over each data set, resumable, shared by all ranks
        cache_target = Target(load_target(target, cache_dtype).model)
        for data_dir, cache_dir in zip(data_dirs, cache_dirs):
            build_cache(cache_target, data_dir, cache_dir, hc.hidden_layers, hc.kv_layer, teacher_topk)
        del cache_target
    if world > 1:
        dist.barrier()
    tgt = Target(load_target(target, "fp32").model)
    r = run_train(tgt, cache_dirs, out, cfg, hc, resume=resume, max_steps=max_steps, init_head=init_head)
    if rank == 0:
        typer.echo(json.dumps(r))


@app.command()
@user_errors
def costs(
    target: str = typer.Option(None, "--target", "-t", help="Local model dir or .gguf [default: embedded SmolLM2]."),
    head: Path = typer.Option(None, "--head", help="Saved head [default: the shipped head, else a fresh one]."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    context: int = typer.Option(256, "--context", help="Cached tokens before the timed forward."),
    max_n: int = typer.Option(9, "--max-n", help="Time target forwards over 1..max_n new tokens."),
    reps: int = typer.Option(15, "--reps"),
    draft_vocab_size: int = typer.Option(None, "--draft-vocab-size",
                                         help="Time a fresh head with this draft vocabulary instead (0 = full)."),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch default)."),
    acceptance: Path = typer.Option(None, "--acceptance", help="JSON from `mtpspec acceptance --out` for this head: "
                                    "also predict the speed-up of each k and pick the best."),
    save_k: bool = typer.Option(False, "--save-k", help="With --acceptance: store the picked k in the head's "
                                "mtp_head.json as its recommended k for this dtype."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Measure a target forward over n tokens and a head draft step on this machine."""
    import torch

    from .config import HeadConfig
    from .measure.costs import measure_costs, pick_k, position_rates, predicted_speedups
    from .core.head import MTPHead
    from .pretrained import save_recommended_k, shipped_head_dir
    from .models import load_target
    from .core.target import Target

    if save_k and acceptance is None:
        raise typer.BadParameter("--save-k needs --acceptance FILE (the rates the choice is based on).")
    if save_k and draft_vocab_size is not None:
        raise typer.BadParameter("--save-k stores k in a saved head; --draft-vocab-size times a fresh one.")
    rates = position_rates(_read_json(acceptance)) if acceptance is not None else None

    if threads:
        torch.set_num_threads(threads)
    loaded = load_target(target, dtype)
    tgt = Target(loaded.model)
    if draft_vocab_size is not None:
        mtp = MTPHead.for_target(tgt, HeadConfig(draft_vocab_size=draft_vocab_size))
    else:
        mtp = load_head(tgt, loaded.name, head, False, lambda m: typer.echo(m, err=True))
    head_dir = head or shipped_head_dir(loaded.name)
    if save_k and head_dir is None:
        raise typer.BadParameter("--save-k needs a saved head (--head DIR, or the shipped one).")
    c = measure_costs(tgt, mtp, max_n=max_n, context=context, reps=reps)
    speedups = predicted_speedups(c, rates) if rates else {}
    best = pick_k(c, rates) if rates else None
    if save_k:
        rec = save_recommended_k(head_dir, c.dtype, best or 0)
        typer.echo(f"saved recommended_k {rec} in {head_dir}", err=True)
    if as_json:
        typer.echo(json.dumps({"dtype": c.dtype, "context": c.context, "verify_ms": {n: v * 1e3 for n, v in c.verify_s.items()},
                               "draft_step_ms": c.draft_step_s * 1e3, "draft_vocab": c.draft_vocab,
                               "predicted_speedup": speedups, "best_k": best}))
        return
    typer.echo(f"{loaded.name} {c.dtype}, {c.context} cached tokens, {torch.get_num_threads()} threads")
    for n, v in c.verify_s.items():
        typer.echo(f"  target forward over {n} token(s): {v * 1e3:7.2f} ms  ({c.relative(n):.2f}x of 1)")
    typer.echo(f"  head draft step ({c.draft_vocab} output rows): {c.draft_step_s * 1e3:.2f} ms "
               f"({c.draft_step_s / c.verify_s[1]:.3f}x of a 1-token target forward)")
    if rates:
        typer.echo(f"  acceptance per position: {', '.join(f'{a:.2f}' for a in rates)}")
        for k, v in speedups.items():
            typer.echo(f"  k={k}: predicted {v:.2f}x over plain decoding")
        typer.echo(f"  best k: {best}" + (" (no k beats plain decoding)" if not best else ""))


@app.command()
@user_errors
def bench(
    prompts: Path = typer.Option(None, "--prompts", help="Spec-Bench style .jsonl [default: the built-in on-device set]."),
    limit: int = typer.Option(None, "--limit", help="Run an evenly spread subset of N prompts."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    target: str = typer.Option(None, "--target", "-t", help="Local model dir or .gguf [default: embedded SmolLM2]."),
    head: Path = typer.Option(None, "--head", help="Saved head directory [default: the shipped head for the target]."),
    drafter: Path = typer.Option(None, "--drafter", help="Independent draft LM directory for `assisted` (<run>/drafter)."),
    k: int = typer.Option(None, "--k", "-k", help="Drafts per round for `mtp` [default: the head's tuned k]."),
    sweep: str = typer.Option(None, "--sweep", help="Comma-separated k values; adds one method mtp_k<k> per value."),
    methods: str = typer.Option("hf,k0,mtp,assisted,lookup", "--methods", help="Comma-separated methods to run."),
    reps: int = typer.Option(1, "--reps", help="Timed repetitions of every prompt."),
    warmup: int = typer.Option(1, "--warmup", help="Prompts every method runs untimed before timing."),
    lookup_tokens: int = typer.Option(10, "--lookup-tokens", help="prompt_lookup_num_tokens for `lookup`."),
    out: Path = typer.Option(None, "--out", "-o", help="Report directory [default: reports/bench-<date>]."),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch default)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
) -> None:
    """Benchmark hf, k0, mtp, assisted and lookup decoding on the same prompts; write a report."""
    import datetime
    import platform

    import torch
    import transformers

    from .measure.bench import BenchConfig, build_methods, load_drafter, run_bench
    from .prompts import load_prompts
    from .errors import InputError
    from .pretrained import shipped_head_dir
    from .models import chat_ids, load_target, resolve_dtype
    from .measure.report import write_report
    from .core.target import Target

    if threads:
        torch.set_num_threads(threads)
    try:
        ks = tuple(int(x) for x in sweep.split(",") if x.strip()) if sweep else ()
    except ValueError:
        raise InputError(f"--sweep must be comma-separated integers, got {sweep!r}.") from None
    cfg = BenchConfig(methods=tuple(m.strip() for m in methods.split(",") if m.strip()), k=k, sweep=ks,
                      max_new_tokens=max_new_tokens, reps=reps, warmup=warmup, lookup_tokens=lookup_tokens)
    plist = load_prompts(prompts, limit)  # fail on a bad prompts file before loading any model
    now = datetime.datetime.now()
    out = out or Path("reports") / f"bench-{now:%Y%m%d-%H%M%S}"

    loaded = load_target(target, dtype)
    notes: list[str] = []
    mtp = None
    head_src = "-"
    if cfg.needs_head:
        def warn(msg: str) -> None:
            typer.echo(msg, err=True)
            notes.append("mtp: no trained head for this target, so a freshly initialised head was used; its "
                         "acceptance is near zero. Pass --head DIR.")

        mtp = load_head(Target(loaded.model), loaded.name, head, False, warn)
        head_src = str(head) if head else str(shipped_head_dir(loaded.name) or "fresh (untrained)")
    assistant = load_drafter(drafter, resolve_dtype(dtype)) if drafter and "assisted" in cfg.methods else None
    method_list, skipped = build_methods(cfg, loaded.model, mtp, assistant)
    info = {
        "date": now.isoformat(timespec="seconds"), "target": loaded.name, "dtype": dtype,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(), "prompts_file": str(prompts or "built-in default"),
        "head": head_src, "drafter": str(drafter) if assistant is not None else "-",
    }
    if assistant is not None:
        gc = assistant.generation_config  # None = the value transformers fills in at generate time
        names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        vals = {n: getattr(gc, n, None) for n in names}
        info["assistant"] = ", ".join(f"{n}={'HF default' if v is None else v}" for n, v in vals.items())
    if "lookup" in cfg.methods:
        info["lookup"] = f"prompt_lookup_num_tokens={cfg.lookup_tokens}"
    inputs = [chat_ids(loaded.tokenizer, p.text) for p in plist]
    result = run_bench(cfg, method_list, plist, inputs, loaded.model, info, notes + skipped, progress)
    write_report(result, out)
    for m in result.methods:
        s = result.summary(m)
        same = "-" if s.identical is None else f"{s.identical}/{s.prompts}"
        xhf = f"{s.speedup_vs_hf:.2f}x hf" if s.speedup_vs_hf is not None else ""
        typer.echo(f"{m:>10}  {s.tokens_per_s:8.1f} tok/s  {xhf:>9}  identical to hf {same}")
    for n in result.notes:
        typer.echo(f"note: {n}")
    typer.echo(f"report written to {out}/results.md")


@app.command()
@user_errors
def acceptance(
    prompts: Path = typer.Option(None, "--prompts", help="Spec-Bench style .jsonl [default: the built-in set]."),
    limit: int = typer.Option(None, "--limit", help="An evenly spread subset of N prompts."),
    target: str = typer.Option(None, "--target", "-t", help="Local model dir or .gguf [default: embedded SmolLM2]."),
    head: Path = typer.Option(None, "--head", help="Saved head [default: the shipped head]."),
    ks: str = typer.Option("1,2,3,4,5,6", "--ks", help="Comma-separated draft lengths."),
    temperatures: str = typer.Option("0", "--temperatures", help="Comma-separated temperatures (0 = greedy)."),
    top_p: float = typer.Option(1.0, "--top-p"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    dtype: str = typer.Option("fp32", "--dtype"),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(None, "--out", "-o", help="Also write the rows as JSON here."),
    threads: int = typer.Option(0, "--threads"),
) -> None:
    """Measure the head's acceptance per category, k and temperature (no timing)."""
    import torch

    from .measure.acceptance import markdown, measure_acceptance
    from .prompts import load_prompts
    from .errors import InputError
    from .models import chat_ids, load_target
    from .core.target import Target

    if threads:
        torch.set_num_threads(threads)
    try:
        k_list = [int(x) for x in ks.split(",") if x.strip()]
        t_list = [float(x) for x in temperatures.split(",") if x.strip()]
    except ValueError:
        raise InputError("--ks and --temperatures must be comma-separated numbers.") from None
    if not k_list or min(k_list) < 1 or not t_list:
        raise InputError("--ks needs values >= 1 and --temperatures at least one value.")
    plist = load_prompts(prompts, limit)
    loaded = load_target(target, dtype)
    tgt = Target(loaded.model)
    mtp = load_head(tgt, loaded.name, head, False, lambda m: typer.echo(m, err=True))
    inputs = [chat_ids(loaded.tokenizer, p.text) for p in plist]
    rows = measure_acceptance(tgt, mtp, plist, inputs, k_list, t_list, max_new_tokens, top_p, seed)
    typer.echo(markdown(rows))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([r.to_dict() for r in rows], indent=1) + "\n")


def main() -> None:  # pragma: no cover
    app()
