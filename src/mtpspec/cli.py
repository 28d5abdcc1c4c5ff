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


def load_head(target: Any, target_name: str, head: Path | None, fresh: bool, warn: Callable[[str], None]) -> Any:
    """The head to draft with: --head, else the head shipped for the embedded default, else a
    freshly initialised one (with a warning: it will accept almost nothing)."""
    from .head import MTPHead
    from .heads import shipped_head_dir

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
    num_draft_tokens: int = typer.Option(None, "--num-draft-tokens", "-k", help="Drafts per round [default: the head's tuned k]; 0 = plain decoding."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    top_p: float = typer.Option(1.0, "--top-p", help="1.0 = off."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling (reproducible output)."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    compare: bool = typer.Option(False, "--compare", help="Also decode plainly (k=0) and print both speeds side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
) -> None:
    """Generate text from a prompt with speculative decoding, streaming tokens as accepted."""
    from .decode import generate as run
    from .heads import default_k
    from .models import chat_ids, load_target
    from .target import Target

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
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch default)."),
) -> None:
    """Write self-distillation data: the target's own prompts and responses, as token shards."""
    import torch

    from .data import DataConfig, generate_data
    from .models import load_target

    if threads:
        torch.set_num_threads(threads)
    cfg = DataConfig(num_samples=num_samples, batch_size=batch_size, max_prompt_tokens=max_prompt_tokens,
                     max_response_tokens=max_response_tokens, prompt_temperature=prompt_temperature,
                     response_temperature=response_temperature, task_share=task_share, seed=seed)
    loaded = load_target(target)
    m = generate_data(loaded.model, loaded.tokenizer, out, cfg, prompts_file, corpus)
    typer.echo(f"{m['num_samples']} samples, {m['num_tokens']} tokens in {m['num_shards']} shards at {out}")


def main() -> None:  # pragma: no cover
    app()
