"""Prompt sets: the built-in on-device set (`default.jsonl`), Spec-Bench style files, and the
prompts of a data set written by `mtpspec data` (as token ids, exactly as the target saw them).

The built-in set holds 24 prompts of the on-device workloads mtpspec is built for
(notification and message summaries, rewriting, smart replies, short chat answers, code
completion, short math); it is never used for training."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError, InputError

if TYPE_CHECKING:
    import torch

DEFAULT_PROMPTS = Path(__file__).parent / "default.jsonl"
# A data set's prompts are grouped by length in tokens: short requests, and the long ones that
# carry a passage or an earlier turn (reports/acceptance/gap/: they accept differently).
SHORT_PROMPT_TOKENS = 160


@dataclass(frozen=True)
class Prompt:
    question_id: Any
    category: str
    text: str  # the first turn; the chat template is applied to it
    # the file's `reference` (Spec-Bench: one per turn, for some categories), for `measure/quality.py`
    reference: Any = field(default=None, compare=False)


def load_prompts(path: str | Path | None = None, limit: int | None = None) -> list[Prompt]:
    """Read a Spec-Bench style jsonl file (`question_id`, `category`, `turns`); None = the
    built-in set. `limit` keeps an evenly spread subset (every len/limit-th prompt), so a small
    limit still samples every part of a file that is sorted by category."""
    p = Path(path).expanduser() if path is not None else DEFAULT_PROMPTS
    if not p.is_file():
        raise DataError(f"Prompts file {p} not found. Give a Spec-Bench style .jsonl file with --prompts, "
                        "or omit it for the built-in set.")
    prompts = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            turns = obj["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise ValueError("`turns` must be a non-empty list of strings")
            prompts.append(Prompt(obj.get("question_id", n), str(obj.get("category", "default")), turns[0],
                                  obj.get("reference")))
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{p}, line {n}: not a Spec-Bench prompt ({e!s}). Each line must be a JSON object "
                            'like {"question_id": 1, "category": "qa", "turns": ["..."]}.') from None
    if not prompts:
        raise DataError(f"Prompts file {p} holds no prompts.")
    return spread(prompts, limit)


def spread(items: list, limit: int | None) -> list:
    """An evenly spread subset of `limit` items (every len/limit-th), or all of them."""
    if limit is not None:
        if limit < 1:
            raise InputError(f"--limit must be >= 1, got {limit}.")
        if limit < len(items):
            items = [items[i * len(items) // limit] for i in range(limit)]
    return items


def data_prompts(data_dir: str | Path, tokenizer: Any, target_identity: Any,
                 limit: int | None = None) -> tuple[list[Prompt], list[torch.Tensor]]:
    """The prompts of a data set written by `mtpspec data`, evenly spread, as the token ids (T,)
    the target answered (chat template, passages and earlier turns included) with their text
    for the record. Category: `short` (under SHORT_PROMPT_TOKENS tokens) or `long`. Only a set
    the head never trained on measures what it does on new requests (reports/acceptance/gap/)."""
    from ..training.shards import load_samples, read_manifest

    m = read_manifest(data_dir)
    if m["target"] != target_identity:
        raise DataError(f"{data_dir} holds data written by another target ({m['target']}); its token ids mean "
                        "nothing to this one. Give a data set of this target, or a .jsonl prompts file.")
    picked = spread(load_samples(data_dir), limit)
    prompts = [Prompt(f"{Path(data_dir).name}/{i}", "short" if n < SHORT_PROMPT_TOKENS else "long",
                      tokenizer.decode(ids[:n].tolist())) for i, (ids, n) in enumerate(picked)]
    return prompts, [ids[:n].long() for ids, n in picked]
