"""Prompt sets: the built-in on-device set (`default.jsonl`) and Spec-Bench style files.

The built-in set holds 24 prompts of the on-device workloads mtpspec is built for
(notification and message summaries, rewriting, smart replies, short chat answers, code
completion, short math); it is never used for training."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError, InputError

DEFAULT_PROMPTS = Path(__file__).parent / "default.jsonl"


@dataclass(frozen=True)
class Prompt:
    question_id: Any
    category: str
    text: str  # the first turn; the chat template is applied to it


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
            prompts.append(Prompt(obj.get("question_id", n), str(obj.get("category", "default")), turns[0]))
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{p}, line {n}: not a Spec-Bench prompt ({e!s}). Each line must be a JSON object "
                            'like {"question_id": 1, "category": "qa", "turns": ["..."]}.') from None
    if not prompts:
        raise DataError(f"Prompts file {p} holds no prompts.")
    if limit is not None:
        if limit < 1:
            raise InputError(f"--limit must be >= 1, got {limit}.")
        if limit < len(prompts):
            prompts = [prompts[i * len(prompts) // limit] for i in range(limit)]
    return prompts
