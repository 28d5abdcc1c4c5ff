"""The `mtpspec` command line: parses arguments, calls the library, prints. Nothing more.

A user's mistake (an `MtpspecError`) becomes one line on stderr and exit status 2."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import typer

from .config import AcceptanceConfig, HeadConfig, SamplingConfig, TrainConfig
from .core.decode import generate as library_generate
from .core.drafters import SWITCH_TOKENS, TREE_NODES
from .detokenize import TextStream
from .errors import InputError, MtpspecError
from .measure.acceptance import measure_acceptance
from .measure.bench import METHODS, BenchConfig
from .measure.costs import measure_costs
from .serve.engine import ServeConfig
from .training.data import DataConfig
from .training.train import train_on_data

# No rich markup: a help text's "[default: ...]" is text, not a tag to strip.
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0], rich_markup_mode=None)
F = TypeVar("F", bound=Callable[..., Any])
N = TypeVar("N", int, float)
C = TypeVar("C")


# -- each default is declared once, by the library: a flag reads it from there -------------------------
def default(source: Any, name: str) -> Any:
    """The default the library declares for `name`: a field of a config dataclass, or a parameter
    of a function."""
    if dataclasses.is_dataclass(source):
        return {f.name: f.default for f in dataclasses.fields(source)}[name]
    return inspect.signature(source).parameters[name].default


def option(source: Any, name: str, *flags: str, **kw: Any) -> Any:
    """The flag for `name` (--name-with-dashes unless `flags` are given), with `source`'s default."""
    return typer.Option(default(source, name), *(flags or (f"--{name.replace('_', '-')}",)), **kw)


def config_from(cls: type[C], args: dict[str, Any], **parsed: Any) -> C:
    """`cls` from a command's arguments that bear its fields' names (flags map one-to-one onto
    fields); `parsed` gives the values a flag's text had to be turned into first."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{**{k: v for k, v in args.items() if k in names}, **parsed})

SERVE_SWITCH_INTERVAL_S = 0.0002  # `mtpspec serve`'s GIL switch interval (see serve)

# Options several commands share, declared once so that they read (and default) alike.
TARGET = typer.Option(None, "--target", "-t", help="Local model dir or .gguf file [default: embedded SmolLM2-135M-Instruct].")
HEAD = typer.Option(None, "--head", help="Saved head directory (or a Gemma 4 assistant folder) "
                    "[default: the shipped head for the target, else a fresh one].")
DTYPE = typer.Option("auto", "--dtype", help="auto (bf16 where the CPU has native bf16, else fp32), fp32, bf16, or q8 "
                     "(GGUF Q4_0/Q4_1/Q8_0 targets: bf16 with 8-bit activations in the matmuls, as llama.cpp "
                     "computes; faster, its own plain decoding the reference).")
THREADS = typer.Option(0, "--threads", help="torch threads (0 = torch default).")
WEIGHTS = typer.Option("auto", "--weights", help="What a GGUF target computes on: auto (its quantized blocks wherever "
                       "the fused forward runs them: the same outputs as dense weights at a third of the bytes or "
                       "less; else dense), gguf, or dense (every matrix dequantized into memory).")
PROMPTS = typer.Option(None, "--prompts", help="Spec-Bench style .jsonl [default: the built-in on-device set].")
LIMIT = typer.Option(None, "--limit", help="Run an evenly spread subset of N prompts.")
K_SWEEP = "1,2,3,4,5,6"  # the chains `mtpspec acceptance` measures unless -k names others
TREE = typer.Option(False, "--tree", help=f"Draft a tree of -k nodes [default {TREE_NODES}] from the head.")
ACCEPTANCE = typer.Option("exact", "--acceptance", help="Which drafts a round accepts: exact (the target's own output), "
                          "or a relaxed rule that also accepts drafts the target finds plausible and so changes the "
                          "output: typical:EPS[,DELTA] (p(x) > min(EPS, DELTA exp(-H)); DELTA defaults to sqrt(EPS)), "
                          "topm:M[,ALPHA] (x among the target's M likeliest and p(x) >= ALPHA p_max), "
                          "entropy:TAU[,M] (where H(p) >= TAU nats, x among the M likeliest). docs/relaxed-acceptance.md.")
SWITCH = typer.Option(False, "--switch", help=f"Each round, draft the prompt-lookup continuation (up to -k tokens "
                      f"[default {SWITCH_TOKENS}]) when the text repeats, else the head's chain.")


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


# -- the three things every command parses alike ------------------------------------------------
def parse_list(text: str, kind: type[N], flag: str, minimum: N | None = None, maximum: N | None = None) -> list[N]:
    """'1,2, 3' -> [1, 2, 3]: a comma-separated flag value, each item a `kind` in [minimum, maximum]."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} must be comma-separated {kind.__name__}s, got {text!r}.") from None
    if not values:
        raise InputError(f"{flag} needs at least one value, got {text!r}.")
    if minimum is not None and min(values) < minimum:
        raise InputError(f"{flag} values must be >= {minimum}, got {text!r}.")
    if maximum is not None and max(values) > maximum:
        raise InputError(f"{flag} values must be <= {maximum}, got {text!r}.")
    return values


def set_threads(threads: int) -> None:
    """--threads: torch's intra-op thread count; 0 leaves torch's default."""
    if threads < 0:
        raise InputError(f"--threads must be >= 0 (0 = torch default), got {threads}.")
    if threads:
        import torch

        torch.set_num_threads(threads)


def open_target(name: str | None, dtype: str, weights: str = "dense") -> tuple[Any, Any]:
    """--target, --dtype and --weights: the loaded model with its tokenizer and name, and its `Target`."""
    from .core.target import Target
    from .models import load_target

    loaded = load_target(name, dtype, weights)
    return loaded, Target(loaded.model)


def _warn(message: str) -> None:
    typer.echo(message, err=True)


def _printer(tokenizer: Any) -> Callable[..., None]:
    """A callback that prints each round's tokens as text as they arrive (`TextStream`, the
    server's detokenizer too); call it with `final=True` at the end for any text held back."""
    text = TextStream(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))

    def show(new: Sequence[int], final: bool = False) -> None:
        sys.stdout.write("".join(p.text for p in text.push(new, final=final)))
        sys.stdout.flush()

    return show


def drafter_kind(tree: bool, switch: bool) -> str:
    """--tree / --switch as a `build_drafter` kind (neither: the head's chain)."""
    if tree and switch:
        raise InputError("--tree and --switch are two ways to draft; choose one.")
    return "tree" if tree else "switch" if switch else "chain"


# -- commands ---------------------------------------------------------------------------------------
@app.command()
@user_errors
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="User message; the chat template is applied."),
    target: str = TARGET,
    head: Path = HEAD,
    fresh_head: bool = typer.Option(False, "--fresh-head", help="Ignore any shipped head; use an untrained one."),
    max_new_tokens: int = option(library_generate, "max_new_tokens", "--max-new-tokens", "-n"),
    num_draft_tokens: int = typer.Option(None, "--num-draft-tokens", "-k",
                                         help="Drafts per round [default: the head's tuned k]; 0 = plain decoding."),
    temperature: float = option(SamplingConfig, "temperature", help="0 = greedy."),
    top_k: int = option(SamplingConfig, "top_k", help="0 = off."),
    top_p: float = option(SamplingConfig, "top_p", help="1.0 = off."),
    seed: int = option(SamplingConfig, "seed", help="Seed for sampling (reproducible output)."),
    dtype: str = DTYPE,
    weights: str = WEIGHTS,
    compare: bool = typer.Option(False, "--compare", help="Also decode plainly (k=0) and print both speeds side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    tree: bool = TREE,
    switch: bool = SWITCH,
    acceptance: str = ACCEPTANCE,
) -> None:
    """Generate text from a prompt with speculative decoding, streaming tokens as accepted."""
    from . import generate as decode
    from .core.drafters import build_drafter
    from .measure.compare import compare as compare_plain
    from .measure.memory import memory_report
    from .models import chat_ids
    from .pretrained import resolve_head

    kind = drafter_kind(tree, switch)
    rule = AcceptanceConfig.parse(acceptance)  # a bad rule fails before any model loads
    loaded, tgt = open_target(target, dtype, weights)
    drafter, k = build_drafter(resolve_head(tgt, loaded.name, head, fresh_head, _warn, assistants=True).head, kind,
                               k=num_draft_tokens)
    ids = chat_ids(loaded.tokenizer, prompt)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    stream = None if as_json else _printer(loaded.tokenizer)
    cmp = compare_plain(tgt, drafter, ids, k, max_new_tokens, on_tokens=stream, acceptance=rule, **sampling) if compare else None
    out = cmp.spec if cmp else decode(tgt, drafter, ids, max_new_tokens=max_new_tokens, num_draft_tokens=k,
                                      on_tokens=stream, acceptance=rule, **sampling)
    if stream:
        stream([], final=True)
    s = out.stats
    if as_json:
        new_ids = out.sequences[0, ids.shape[1]:].tolist()
        obj: dict[str, Any] = {"text": loaded.tokenizer.decode(new_ids, skip_special_tokens=True), "token_ids": new_ids,
                               "num_draft_tokens": k, "acceptance": rule.label, "exact": rule.exact, "stats": s.to_dict(),
                               "dtype": str(tgt.dtype).removeprefix("torch."),
                               "weights": loaded.weights, "weights_reason": loaded.weights_reason,
                               "memory": memory_report(tgt, drafter)}
        if cmp:
            obj["plain"] = {"identical": cmp.identical, "stats": cmp.plain.stats.to_dict(), "speedup": round(cmp.speedup, 3)}
        typer.echo(json.dumps(obj))
        return
    tok_s = cmp.spec_tokens_per_s if cmp else (s.tokens_per_s or 0.0)
    typer.echo(f"\n[{s.new_tokens} tokens, {tok_s:.1f} tok/s, k={k}, {s.mean_accepted:.2f} tokens per target forward, "
               f"{s.target_forwards} target forwards; {tgt.dtype_name} on {loaded.weights} weights]")
    if not rule.exact:
        typer.echo(f"[relaxed acceptance {rule.label}: this output is not necessarily the target's own]")
    if cmp:
        typer.echo(f"[plain decoding: {cmp.plain_tokens_per_s:.1f} tok/s; with drafts: {cmp.speedup:.2f}x; "
                   f"outputs {'identical' if cmp.identical else 'DIFFERENT'}]")


@app.command()
@user_errors
def data(
    out: Path = typer.Option(..., "--out", "-o", help="Output directory (resumes if it holds a partial run)."),
    target: str = TARGET,
    num_samples: int = option(DataConfig, "num_samples", help="Samples to write in all (one per answer)."),
    recipe: str = option(DataConfig, "recipe", help="chat (instruct models: self-written turns, passages and "
                         "requests over them, follow-ups), continuation (base models), or auto (chat when the "
                         "tokenizer has a chat template)."),
    batch_size: int = option(DataConfig, "batch_size"),
    max_prompt_tokens: int = option(DataConfig, "max_prompt_tokens"),
    max_response_tokens: int = option(DataConfig, "max_response_tokens"),
    max_document_tokens: int = option(DataConfig, "max_document_tokens", help="Longest passage of the document recipe."),
    prompt_temperature: float = option(DataConfig, "prompt_temperature"),
    response_temperature: float = option(DataConfig, "response_temperature", help="0 = greedy responses."),
    task_share: float = option(DataConfig, "task_share", help="Share of short user turns seeded with an on-device task opener."),
    document_share: float = option(DataConfig, "document_share", help="Share of seeds that write a passage, then a request "
                                   "over it."),
    follow_up_share: float = option(DataConfig, "follow_up_share", help="Share of answered chats given a second user turn."),
    prompts_file: str = typer.Option(None, "--prompts-file", help="Extra prompts: .jsonl or .txt."),
    corpus: str = typer.Option(None, "--corpus", help="Extra raw-text corpus (plain text); chunks become prefixes to continue."),
    passages: list[str] = typer.Option(None, "--passages", help="Real passages (a text file or a directory of "
                                       ".md/.rst/.txt and source files; repeat for several): a share of the document "
                                       "seeds asks over one of them instead of a passage the target writes."),
    passage_share: float = option(DataConfig, "passage_share", help="With --passages: share of document seeds that take a "
                                  "real passage."),
    everyday_share: float = option(DataConfig, "everyday_share", help="Share of seeds that are everyday requests assembled "
                                   "from templates (notifications, chats, emails with names and times; replies, "
                                   "rewrites, short questions, code stubs) instead of turns the target writes."),
    seed: int = option(DataConfig, "seed"),
    dtype: str = typer.Option("auto", "--dtype", help="Generation dtype: bf16, fp32, or auto (the set's own dtype when "
                              "extending one, else bf16 where the CPU has native bf16 matmuls and fp32 where bf16 is "
                              "emulated, several times slower than fp32)."),
    engine: str = typer.Option("batch", "--engine", help="batch: mtpspec's own batched decode loop (each answer is "
                               "mtpspec's plain decoding of it; greedy answers drafted by the head), or hf: Hugging Face "
                               "generate (the older sets' generator). A set is always extended by the engine that "
                               "started it."),
    head: Path = typer.Option(None, "--head", help="With --engine batch: the head that drafts greedy answers [default: "
                              "the shipped head for the target, else none: plain decoding, the same text]."),
    weights: str = WEIGHTS,
    threads: int = THREADS,
) -> None:
    """Write self-distillation data: the target's own prompts and responses, as compressed token shards."""
    from .core import fused
    from .pretrained import load_head, shipped_head_dir
    from .training.data import check_engine, generate_data, recorded_dtype, recorded_engine

    cfg = config_from(DataConfig, locals())
    set_threads(threads)
    if dtype == "auto":
        dtype = recorded_dtype(out) or "auto"
    check_engine(engine)  # before the model loads
    engine = recorded_engine(out) or engine
    # Hugging Face's generate computes on dense weights; the batched loop on the file's blocks (same
    # values), or where the CPU has AMX tiles (on which the writer runs the blocks) on their
    # dequantized copy: the tiles compute the same numbers from it (tests/test_quant.py) without
    # dequantizing each block in every forward (64 rows at 200 positions 49 against 54 ms, and
    # the same shards: reports/batching/)
    if engine == "batch" and weights == "auto" and fused.uses_amx():
        weights = "dense"
    loaded, tgt = open_target(target, dtype, weights if engine == "batch" else "dense")
    drafter = None
    if engine == "batch":
        where = head if head is not None else shipped_head_dir(loaded.name)
        drafter = load_head(where, tgt, assistants=True) if where is not None else None
    m = generate_data(loaded.model, loaded.tokenizer, out, cfg, prompts_file, corpus, passages=passages or None,
                      engine=engine, head=drafter)
    typer.echo(f"{m['num_samples']} samples, {m['num_tokens']} tokens ({m['num_response_tokens']} in responses) "
               f"in {m['num_shards']} shards at {out}")


@app.command()
@user_errors
def train(
    data_dirs: list[Path] = typer.Option(..., "--data", "-d", help="Directory written by `mtpspec data`, or DIR:N for its first N shards, "
                                     "DIR:A-B for its shards A to B - 1 (a kept set grows; a recipe names the shards it trained "
                                     "on); repeat to train on several."),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory: activations/ (activations-1/, ... for further data sets), "
                             "checkpoint.pt, metrics.jsonl, head/ (or draft_model/, assistant/)."),
    target: str = TARGET,
    kind: str = option(TrainConfig, "kind", help="mtp (the MTP head), draft-model (a small standalone draft LM, the "
                       "baseline `mtpspec bench --draft-model` runs), or gemma4-assistant (a Gemma 4 target's drafter "
                       "as a Gemma4AssistantForCausalLM folder, which HF and the serving engines load)."),
    max_draft_tokens: int = option(TrainConfig, "max_draft_tokens", help="Draft steps unrolled in training. The head "
                                   "drafts more at decode time (its block is shared across steps); at equal time 2 "
                                   "beat 3 and 6 by far (reports/training/train-rows/)."),
    epochs: int = option(TrainConfig, "epochs", help="Passes over the training split (more for a small set: --min-steps)."),
    min_steps: int = option(TrainConfig, "min_steps", help="At least this many optimizer steps: a set too small for them "
                            "in --epochs passes is passed over more times (0 = exactly --epochs passes)."),
    batch_size: int = option(TrainConfig, "batch_size"),
    lr: float = option(TrainConfig, "lr"),
    warmup_steps: int = option(TrainConfig, "warmup_steps", help="Longest linear warm-up, in optimizer steps."),
    warmup_fraction: float = option(TrainConfig, "warmup_fraction", help="Warm-up as a share of the run's steps (at most "
                                    "--warmup-steps), so a short run is not spent warming up."),
    weight_decay: float = option(TrainConfig, "weight_decay"),
    clip: float = option(TrainConfig, "clip"),
    bf16: bool = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast for training the head or draft model "
                              "[default: on a GPU, and on a CPU with native bf16 matmuls; else off]."),
    holdout: float = option(TrainConfig, "holdout"),
    eval_every: int = option(TrainConfig, "eval_every"),
    save_every: int = option(TrainConfig, "save_every"),
    label_weight: float = option(TrainConfig, "label_weight"),
    feature_weight: float = option(TrainConfig, "feature_weight", help="Weight of the EAGLE-style feature loss."),
    step_decay: float = option(TrainConfig, "step_decay", help="Loss weight of draft step j is step_decay**j."),
    tv_weight: float = option(TrainConfig, "tv_weight", help="Weight of a total-variation (acceptance-aligned) loss term."),
    round_weight: float = option(TrainConfig, "round_weight", help="Extra loss weight on the rows where greedy decoding "
                                 "with the head as it is would start a round (0 = all rows alike)."),
    copy_context: bool = option(TrainConfig, "copy_context", "--copy-context/--no-copy-context", help="Also score each "
                                "row's context tokens outside the draft vocabulary, as drafting does (copied names, "
                                "numbers, rare words)."),
    micro_batch_tokens: int = option(TrainConfig, "micro_batch_tokens", help="Run each batch in parts of at most this "
                                     "many padded tokens (gradients accumulated; bounds memory); 0 = whole batches."),
    init_head: Path = typer.Option(None, "--init-head", help="Continue training this saved head (its architecture and "
                                   "draft vocabulary are kept; the architecture flags below are then ignored)."),
    draft_model_hidden: int = option(TrainConfig, "draft_model_hidden", help="Hidden size of --kind draft-model."),
    draft_model_layers: int = option(TrainConfig, "draft_model_layers", help="Layers of --kind draft-model."),
    draft_model_init: str = option(TrainConfig, "draft_model_init", help="How --kind draft-model starts: random, or "
                                   "target (a copy of the target's embedding, first --draft-model-layers layers and "
                                   "final norm; a Llama target, --draft-model-hidden = its width)."),
    assistant_hidden: int = option(TrainConfig, "assistant_hidden", help="Width of --kind gemma4-assistant."),
    assistant_layers: int = option(TrainConfig, "assistant_layers", help="Layers of --kind gemma4-assistant (the last "
                                   "one full attention, the others sliding)."),
    seed: int = option(TrainConfig, "seed"),
    hidden_layers: str = typer.Option(",".join(map(str, default(HeadConfig, "hidden_layers"))), "--hidden-layers",
                                      help="Comma-separated target layers the head reads."),
    kv_layer: int = option(HeadConfig, "kv_layer"),
    num_blocks: int = option(HeadConfig, "num_blocks"),
    mlp_ratio: float = option(HeadConfig, "mlp_ratio"),
    draft_vocab_size: int = option(HeadConfig, "draft_vocab_size", help="0 = full vocabulary."),
    teacher_topk: int = option(train_on_data, "teacher_topk", help="Teacher log-probs kept per position."),
    cache_dtype: str = option(train_on_data, "cache_dtype", help="dtype of the one target pass that caches activations: "
                              "auto = bf16 on a GPU or where the CPU has native bf16 matmuls, else fp32."),
    resume: bool = typer.Option(False, "--resume", help="Continue from out/checkpoint.pt."),
    max_steps: int = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps (time-boxing)."),
    online: bool = typer.Option(False, "--online", help="No activation cache on disk (~2 KB per token): the target "
                                "computes each sample's activations when training reads it, the same values, one "
                                "forward per sample per epoch. What a set already has cached in --out (or "
                                "--cache-from) is read from there; only the rest is computed."),
    cache_from: Path = typer.Option(None, "--cache-from", help="With --online: a run folder whose activation caches "
                                    "(activations*/, for the same target and head settings) hold some of the data "
                                    "already; those samples are read from it instead of computed again."),
    device: str = typer.Option("cpu", "--device", help="Where the target and the head compute: cpu, cuda (under torchrun, "
                               "each rank's LOCAL_RANK GPU), cuda:N, or auto (cuda where PyTorch sees a GPU)."),
    threads: int = THREADS,
) -> None:
    """Train an MTP head (or a baseline draft model, or a Gemma 4 assistant) on the target's outputs; the target stays frozen."""
    from .models import auto_autocast
    from .training.devices import resolve_device

    args = locals()
    set_threads(threads)
    dev = resolve_device(device)  # a GPU asked for where there is none: a clear error before anything loads
    # --bf16 left out: on for a GPU, else the CPU's choice (TrainConfig's default is for callers who know their machine)
    cfg = config_from(TrainConfig, args, bf16=(dev.type == "cuda" or auto_autocast()) if bf16 is None else bf16)
    hc = config_from(HeadConfig, args, hidden_layers=tuple(parse_list(hidden_layers, int, "--hidden-layers")))
    r = train_on_data(data_dirs, out, cfg, hc, target, teacher_topk=teacher_topk, cache_dtype=cache_dtype, resume=resume,
                      max_steps=max_steps, init_head=init_head, online=online, device=dev,
                      cache_from=cache_from)
    if r is not None:  # rank 0 reports for all
        typer.echo(json.dumps(r))


@app.command()
@user_errors
def costs(
    target: str = TARGET,
    head: Path = HEAD,
    dtype: str = DTYPE,
    weights: str = WEIGHTS,
    context: int = option(measure_costs, "context", help="Cached tokens before the timed forward."),
    max_n: int = option(measure_costs, "max_n", help="Time target forwards over 1..max_n new tokens."),
    reps: int = option(measure_costs, "reps"),
    draft_vocab_size: int = typer.Option(None, "--draft-vocab-size",
                                         help="Time a fresh head with this draft vocabulary instead (0 = full)."),
    threads: int = THREADS,
    acceptance: Path = typer.Option(None, "--acceptance", help="JSON from `mtpspec acceptance --out` for this head: "
                                    "also predict the speed-up of each k and pick the best."),
    save_k: bool = typer.Option(False, "--save-k", help="With --acceptance: store the picked k in the head's "
                                "mtp_head.json as its recommended k for this dtype."),
    bandwidth_mib: int = typer.Option(1024, "--bandwidth-mib", help="Measure the memory bandwidth by streaming a "
                                      "buffer of this many MiB (far beyond the last-level cache) and set a forward "
                                      "beside its bandwidth limit; 0 = skip."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Measure a target forward over n tokens and a head draft step on this machine, and the
    memory bandwidth: the bytes a forward reads over it are the fastest a forward can be."""
    import torch

    from .core.head import MTPHead
    from .measure.costs import pick_k, predicted_speedups, read_position_rates
    from .pretrained import resolve_head, save_recommended_k

    if save_k and acceptance is None:
        raise InputError("--save-k needs --acceptance FILE (the rates the choice is based on).")
    if save_k and draft_vocab_size is not None:
        raise InputError("--save-k stores k in a saved head; --draft-vocab-size times a fresh one.")
    rates = read_position_rates(acceptance) if acceptance is not None else None
    set_threads(threads)
    loaded, tgt = open_target(target, dtype, weights)
    if draft_vocab_size is not None:
        mtp, head_dir = MTPHead.for_target(tgt, HeadConfig(draft_vocab_size=draft_vocab_size)), None
    else:
        choice = resolve_head(tgt, loaded.name, head, warn=_warn, assistants=True)
        mtp, head_dir = choice.head, choice.directory
    if save_k and head_dir is None:
        raise InputError("--save-k needs a saved head (--head DIR, or the shipped one).")
    if save_k and not isinstance(mtp, MTPHead):
        raise InputError("--save-k stores k in an MTP head's mtp_head.json; for a Gemma 4 assistant, set "
                         "num_assistant_tokens in its generation_config.json.")
    c = measure_costs(tgt, mtp, max_n=max_n, context=context, reps=reps, bandwidth_bytes=bandwidth_mib * 2**20)
    speedups = predicted_speedups(c, rates) if rates else {}
    best = pick_k(c, rates) if rates else None
    if save_k and head_dir is not None:
        rec = save_recommended_k(head_dir, c.dtype, best or 0)
        typer.echo(f"saved recommended_k {rec} in {head_dir}", err=True)
    rc = c.round_costs()
    if as_json:
        typer.echo(json.dumps({"dtype": c.dtype, "weights": loaded.weights, "context": c.context,
                               "verify_ms": {n: v * 1e3 for n, v in c.verify_s.items()},
                               "draft_step_ms": c.draft_step_s * 1e3, "draft_vocab": c.draft_vocab,
                               "tree_verify_ms": c.tree_verify_s * 1e3 if c.tree_verify_s else None,
                               "round_costs": dataclasses.asdict(rc) if rc else None,
                               "predicted_speedup": speedups, "best_k": best,
                               "memory": c.memory.to_dict() if c.memory else None}))
        return
    typer.echo(f"{loaded.name} {c.dtype} on {loaded.weights} weights, {c.context} cached tokens, {torch.get_num_threads()} threads")
    for n, v in c.verify_s.items():
        typer.echo(f"  target forward over {n} token(s): {v * 1e3:7.2f} ms  ({c.relative(n):.2f}x of 1)")
    typer.echo(f"  head draft step ({c.draft_vocab} output rows): {c.draft_step_s * 1e3:.2f} ms "
               f"({c.draft_step_s / c.verify_s[1]:.3f}x of a 1-token target forward)")
    if rc is not None and c.tree_verify_s is not None:
        typer.echo(f"  tree verify (spine of 4 + 3 siblings, 4 planes): {c.tree_verify_s * 1e3:.2f} ms; cost-shaped "
                   f"tree prices here: RoundCosts(row={rc.row:.3f}, plane={rc.plane:.3f}, step={rc.step:.3f})")
    if c.memory is not None:
        typer.echo(c.memory.line())
    if rates:
        typer.echo(f"  acceptance per position: {', '.join(f'{a:.2f}' for a in rates)}")
        for k, v in speedups.items():
            typer.echo(f"  k={k}: predicted {v:.2f}x over plain decoding")
        typer.echo(f"  best k: {best}" + (" (no k beats plain decoding)" if not best else ""))


@app.command()
@user_errors
def bench(
    prompts: Path = PROMPTS,
    limit: int = LIMIT,
    max_new_tokens: int = option(BenchConfig, "max_new_tokens", "--max-new-tokens", "-n"),
    dtype: str = DTYPE,
    weights: str = WEIGHTS,
    target: str = TARGET,
    head: Path = HEAD,
    draft_model: Path = typer.Option(None, "--draft-model", help="Draft model directory for `draft-model` and "
                                     "`assisted` (<run>/draft_model from `mtpspec train --kind draft-model`) [default: "
                                     "the baseline shipped for the target, if any]."),
    draft_model_k: int = option(BenchConfig, "draft_model_k", help="Drafts per round for `draft-model` [default: "
                                "mtp's k]."),
    num_draft_tokens: int = option(BenchConfig, "num_draft_tokens", "--num-draft-tokens", "-k",
                                   help="Drafts per round for `mtp` [default: the head's tuned k]."),
    sweep: str = typer.Option(None, "--sweep", help="Comma-separated k values; adds one method mtp_k<k> per value."),
    methods: str = typer.Option(",".join(default(BenchConfig, "methods")), "--methods",
                                help=f"Comma-separated: {', '.join(METHODS)} (llamacpp, llamacpp-lookup: llama.cpp "
                                "greedy / prompt lookup on the target's GGUF file, if llama-cpp-python is installed)."),
    hf_dtype: str = typer.Option("fp32", "--hf-dtype", help="dtype of HF's own methods (hf, lookup, assisted): "
                                 "fp32 is what HF loads by default; 'same' = --dtype."),
    tree_nodes: int = option(BenchConfig, "tree_nodes", help="Draft nodes per round for mtp-tree and hybrid."),
    tree_shape: str = option(BenchConfig, "tree_shape", help="How mtp-tree and hybrid shape each round's tree: 'cost' "
                             "(from the measured costs and the head's confidence) or 'fixed' (the --tree-nodes best "
                             "nodes, --tree-floor)."),
    tree_depth: int = option(BenchConfig, "tree_depth", help="Deepest node of those trees."),
    tree_floor: float = option(BenchConfig, "tree_floor", help="--tree-shape fixed: least cumulative draft probability of "
                               "a node off the head's greedy spine."),
    hybrid_lookup: int = option(BenchConfig, "hybrid_lookup", help="Prompt-lookup nodes in each hybrid tree."),
    switch_tokens: int = option(BenchConfig, "switch_tokens", help="Longest prompt-lookup chain of `switch` (its other "
                                "rounds draft the head's chain)."),
    reps: int = option(BenchConfig, "reps", help="Timed repetitions of every prompt."),
    warmup: int = option(BenchConfig, "warmup", help="Prompts every method runs untimed before timing."),
    lookup_tokens: int = option(BenchConfig, "lookup_tokens", help="prompt_lookup_num_tokens for `lookup`."),
    llamacpp_lookup_k: int = option(BenchConfig, "llamacpp_lookup_k", help="Drafts per round (num_pred_tokens) of "
                                    "`llamacpp-lookup`."),
    acceptance: str = typer.Option(";".join(default(BenchConfig, "acceptance")), "--acceptance",
                                   help="The relaxed rules of `mtp-relaxed`, separated by ';' (one method each; "
                                   "e.g. 'typical:0.09;topm:3,0.3;entropy:2'), as `generate --acceptance` reads them."),
    quality: bool = option(BenchConfig, "quality", "--quality/--no-quality", help="Score every output: the target's "
                           "mean log-probability of it, its token edit distance to k0's, and where the prompts have "
                           "references (Spec-Bench), ROUGE-L / chrF / final answer / answer contained."),
    out: Path = typer.Option(None, "--out", "-o", help="Report directory [default: bench-out/<date>-<time>]."),
    threads: int = THREADS,
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
) -> None:
    """Benchmark hf, k0, mtp, assisted and lookup decoding (and relaxed acceptance, mtp-relaxed) on the same
    prompts; write a report."""
    import datetime

    from .measure.bench import FRESH_HEAD_NOTE, build_methods, environment_info, load_draft_model, run_bench
    from .measure.memory import line as memory_line
    from .measure.memory import memory_report
    from .measure.quality import QualityScorer, missing_libraries
    from .measure.report import quality_lines, summary_line, verify_cost_line, write_report
    from .models import chat_ids, gguf_file, resolve_dtype
    from .pretrained import resolve_head, shipped_draft_model_dir
    from .prompts import load_prompts

    cfg = config_from(BenchConfig, locals(), methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
                      sweep=tuple(parse_list(sweep, int, "--sweep")) if sweep else (),
                      acceptance=tuple(a.strip() for a in acceptance.split(";") if a.strip()))
    set_threads(threads)
    plist = load_prompts(prompts, limit)  # fail on a bad prompts file before loading any model
    now = datetime.datetime.now()
    out = out or Path("bench-out") / f"{now:%Y%m%d-%H%M%S}"

    loaded, tgt = open_target(target, dtype, weights)
    hf_torch_dtype = tgt.dtype if hf_dtype == "same" else resolve_dtype(hf_dtype)
    hf_model = None
    # HF's own methods run its modules op by op: on dense weights, as transformers loads them
    if (hf_torch_dtype != tgt.dtype or loaded.weights != "dense") and any(m in cfg.methods for m in ("hf", "lookup", "assisted")):
        hf_model = open_target(target, hf_torch_dtype)[0].model
    choice = resolve_head(tgt, loaded.name, head, warn=_warn, assistants=True) if cfg.needs_head else None
    if draft_model is None and "draft-model" in cfg.methods:
        draft_model = shipped_draft_model_dir(loaded.name)  # None: build_methods says how to train one
    wants = "assisted" in cfg.methods or "draft-model" in cfg.methods
    assistant = load_draft_model(draft_model, hf_torch_dtype) if draft_model and wants else None
    gguf = gguf_file(target) if cfg.needs_gguf else None
    method_list, notes = build_methods(cfg, loaded.model, choice.head if choice else None, assistant, hf_model, gguf)
    if choice and choice.directory is None:
        notes.insert(0, FRESH_HEAD_NOTE)
    dt_name = tgt.dtype_name
    info = environment_info(cfg, loaded.name, dt_name, prompts, choice.source if choice else "-", assistant, draft_model, now)
    info["hf_dtype"] = str(hf_torch_dtype).removeprefix("torch.")
    info["kernels"] = "fused (one C call per forward, core/fused.py)" if tgt.engine == "fused" else str(tgt.plan)
    info["weights"] = loaded.weights_reason or loaded.weights
    inputs = [chat_ids(loaded.tokenizer, p.text) for p in plist]
    scorer = None
    if cfg.quality:
        missing = missing_libraries()
        if missing and any(p.reference is not None for p in plist):
            notes.append(f"quality: reference metrics skipped, {' and '.join(missing)} not installed "
                         "(pip install 'mtpspec[quality]').")
        scorer = QualityScorer(tgt, lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True), references=not missing)
    result = run_bench(cfg, method_list, plist, inputs, info, notes, progress, scorer)
    result.info["memory"] = memory_report(tgt, choice.head if choice else None)
    write_report(result, out)
    typer.echo(f"mtpspec in {dt_name} ({tgt.engine} forward) on {info['weights']}; HF's methods in {info['hf_dtype']}, "
               f"{info['threads']} threads")
    for m in result.methods:
        typer.echo(summary_line(result, m))
    cost = verify_cost_line(result)
    if cost:
        typer.echo(cost)
    for line in quality_lines(result):
        typer.echo(line)
    typer.echo(memory_line(result.info["memory"]) + " (the process holds HF's dense model too, where HF's methods ran)")
    for n in result.notes:
        typer.echo(f"note: {n}")
    typer.echo(f"report written to {out}/results.md")


@app.command()
@user_errors
def acceptance(
    prompts: Path = typer.Option(None, "--prompts", help="Spec-Bench style .jsonl, or a data directory written by "
                                 "`mtpspec data` for this target (its prompts as the target saw them; use a set the "
                                 "head never trained on) [default: the built-in on-device set]."),
    limit: int = LIMIT,
    target: str = TARGET,
    head: Path = HEAD,
    num_draft_tokens: str = typer.Option(None, "--num-draft-tokens", "-k",
                                         help=f"Comma-separated drafts per round (k) to measure [default {K_SWEEP}]; "
                                         f"with --tree, most nodes per round [default {TREE_NODES}]."),
    tree: bool = typer.Option(False, "--tree", help="Draft a tree from the head, as `generate --tree` and `bench "
                              "--methods mtp-tree` do, and count its tokens per forward."),
    tree_shape: str = option(BenchConfig, "tree_shape", help="With --tree: cost (shaped each round by the round's costs "
                             "and the head's confidence, as `generate --tree`) or fixed (the N best nodes, 6 deep at "
                             "most)."),
    tree_floor: float = option(BenchConfig, "tree_floor", help="--tree-shape fixed: least cumulative draft probability "
                               "of a node off the head's greedy spine (0 = the N best nodes, whatever they are)."),
    temperatures: str = typer.Option("0", "--temperatures", help="Comma-separated temperatures (0 = greedy)."),
    top_p: float = option(measure_acceptance, "top_p"),
    max_new_tokens: int = option(measure_acceptance, "max_new_tokens", "--max-new-tokens", "-n"),
    dtype: str = DTYPE,
    weights: str = WEIGHTS,
    seed: int = option(measure_acceptance, "seed"),
    out: Path = typer.Option(None, "--out", "-o", help="Also write the rows as JSON here."),
    threads: int = THREADS,
) -> None:
    """Measure the head's acceptance per category, k and temperature (no timing)."""
    from .core.drafters import head_round_costs, tree_config
    from .core.kernels import R_MAX
    from .measure.acceptance import markdown
    from .models import chat_ids
    from .pretrained import resolve_head
    from .prompts import data_prompts, load_prompts

    if num_draft_tokens is None:
        num_draft_tokens = str(TREE_NODES) if tree else K_SWEEP
    # a verify pass holds at most R_MAX rows: the last committed token and the drafts
    k_list = parse_list(num_draft_tokens, int, "--num-draft-tokens", minimum=1, maximum=R_MAX - 1)
    tree_config(tree_shape, "torch", floor=tree_floor)  # a bad --tree-shape or floor fails before any model loads
    if not tree and (tree_shape != default(BenchConfig, "tree_shape") or tree_floor != default(BenchConfig, "tree_floor")):
        raise InputError("--tree-shape and --tree-floor shape a draft tree: add --tree.")
    t_list = parse_list(temperatures, float, "--temperatures", minimum=0.0)
    set_threads(threads)
    from_data = prompts is not None and prompts.is_dir()
    if from_data:
        from .training.shards import read_manifest

        read_manifest(prompts)  # not a data set: say so before loading the model
    plist = [] if from_data else load_prompts(prompts, limit)
    loaded, tgt = open_target(target, dtype, weights)
    mtp = resolve_head(tgt, loaded.name, head, warn=_warn, assistants=True).head
    if from_data:
        plist, inputs = data_prompts(prompts, loaded.tokenizer, dataclasses.asdict(tgt.identity()), limit)
    else:
        inputs = [chat_ids(loaded.tokenizer, p.text) for p in plist]
    rows = measure_acceptance(tgt, mtp, plist, inputs, k_list, t_list, max_new_tokens, top_p, seed,
                              tree=tree_config(tree_shape, tgt.engine, floor=tree_floor, costs=head_round_costs(mtp))
                              if tree else None)
    typer.echo(markdown(rows))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([r.to_dict() for r in rows], indent=1) + "\n")


def main() -> None:  # pragma: no cover
    app()


@app.command()
@user_errors
def serve(
    port: int = typer.Option(8000, "--port", help="TCP port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind: loopback by default; 0.0.0.0 exposes the "
                             "server to the network (no authentication)."),
    target: str = TARGET,
    head: Path = HEAD,
    dtype: str = DTYPE,
    weights: str = WEIGHTS,
    num_draft_tokens: int = option(ServeConfig, "num_draft_tokens", "--num-draft-tokens", "-k",
                                   help="Drafts per round [default: the head's tuned k]; 0 = plain decoding."),
    max_queue: int = option(ServeConfig, "max_queue", help="Requests that may wait while --max-running are decoded; one "
                            "more gets 429."),
    max_running: int = option(ServeConfig, "max_running", help="Requests decoded together (continuous batching; each "
                              "reply is what it decodes alone); 1 = one at a time."),
    max_rows: int | None = option(ServeConfig, "max_rows", help="Rows one target forward may run: the running requests' "
                                  "rounds plus prompt chunks [default: 64 where quantized matrices run on AMX tiles, "
                                  "else 48]."),
    amx_blocks: bool | None = typer.Option(None, "--amx-blocks/--no-amx-blocks", help="Quantized matrices on the AMX "
                                           "tiles where the CPU has them (many rows a forward cost about one; one row "
                                           "costs more) [default: when --max-running > 1]."),
    prefix_keep: int = option(ServeConfig, "prefix_keep", help="Finished requests whose caches are kept: a prompt that "
                              "begins as one of theirs did (a chat's next turn, a shared system prompt) copies that "
                              "prefix instead of prefilling it; 0 = none."),
    stream_interval: float = option(ServeConfig, "stream_interval", help="Seconds a request's new text may wait to go "
                                    "out with its next round's: fewer, larger stream chunks under load; 0 = every round "
                                    "as soon as it is accepted."),
    max_tokens_limit: int = option(ServeConfig, "max_tokens_limit", help="Most new tokens one request may ask for."),
    default_max_tokens: int = option(ServeConfig, "default_max_tokens", help="New tokens when a request names no "
                                     "max_tokens."),
    tree: bool = TREE,
    switch: bool = SWITCH,
    threads: int = THREADS,
) -> None:
    """Serve the target with its head over HTTP: OpenAI-compatible /v1/chat/completions and /v1/completions
    (streaming included), /health, /metrics, and a playground at /."""
    try:
        import uvicorn

        from .serve.app import create_app
    except ImportError as e:
        raise MtpspecError(f"`mtpspec serve` needs the serve extra ({e.name} is missing): pip install 'mtpspec[serve]'") from None
    from .serve import load_engine

    set_threads(threads)
    # The decode thread gives up the GIL for each forward (C) and needs it back the moment the
    # forward ends; by default a thread may wait up to 5 ms for the event loop to hand it over.
    sys.setswitchinterval(SERVE_SWITCH_INTERVAL_S)
    engine = load_engine(target, head, dtype, num_draft_tokens, weights=weights, warn=_warn, drafter=drafter_kind(tree, switch),
                         max_queue=max_queue, max_running=max_running, max_rows=max_rows, amx_blocks=amx_blocks,
                         prefix_keep=prefix_keep, stream_interval=stream_interval, max_tokens_limit=max_tokens_limit,
                         default_max_tokens=default_max_tokens)
    try:
        uvicorn.run(create_app(engine), host=host, port=port)
    finally:
        engine.close()
