"""Heads shipped with the package, one folder per embedded target, and the policy that picks
the head to draft with; beside a head, the baseline draft model it is measured against."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import HeadConfig
from ..core.assistant import AssistantDrafter, is_assistant_dir, load_assistant
from ..core.drafters import FALLBACK_K as FALLBACK_K  # the head's own k lives with the drafters
from ..core.drafters import default_k as default_k
from ..core.head import CONFIG_NAME, MTPHead, saved_head_config
from ..errors import InputError

HERE = Path(__file__).parent


def shipped_head_dir(target_name: str) -> Path | None:
    d = HERE / target_name
    return d if (d / CONFIG_NAME).is_file() else None


DRAFT_MODEL_DIR = "draft_model"  # the baseline draft model shipped beside a head (`mtpspec bench --methods draft-model`)


def shipped_draft_model_dir(target_name: str) -> Path | None:
    """The baseline draft model shipped for `target_name`, if any (a saved HF model folder)."""
    d = HERE / target_name / DRAFT_MODEL_DIR
    return d if (d / "config.json").is_file() else None


FRESH_HEAD_WARNING = ("warning: no trained head for this target; using a freshly initialised head, which accepts "
                      "few drafts. Train one with `mtpspec data` and `mtpspec train`, then pass --head DIR.")


@dataclass(frozen=True)
class HeadChoice:
    head: MTPHead | AssistantDrafter  # an AssistantDrafter only where `resolve_head(assistants=True)`
    directory: Path | None  # where it was loaded from; None = freshly initialised (untrained)

    @property
    def source(self) -> str:
        """For reports: the directory, or that the head is untrained."""
        return str(self.directory) if self.directory is not None else "fresh (untrained)"


def resolve_head(target: Any, target_name: str, head_dir: str | Path | None = None, fresh: bool = False,
                 warn: Callable[[str], None] | None = None, assistants: bool = False) -> HeadChoice:
    """The head to draft with: `head_dir` if given, else the head shipped for `target_name`
    (unless `fresh`), else a freshly initialised one - after calling `warn` with
    FRESH_HEAD_WARNING, since an untrained head accepts almost nothing. `assistants`: a
    `head_dir` may be a Gemma 4 assistant folder (`load_head`)."""
    if head_dir is not None:
        return HeadChoice(load_head(head_dir, target, assistants), Path(head_dir))
    shipped = shipped_head_dir(target_name)
    if shipped is not None and not fresh:
        return HeadChoice(load_head(shipped, target), shipped)
    if warn is not None:
        warn(FRESH_HEAD_WARNING)
    return HeadChoice(MTPHead.for_target(target), None)


def load_head(head_dir: str | Path, target: Any, assistants: bool = False) -> Any:
    """`MTPHead.from_pretrained`: a damaged directory is an InputError that names it. A Gemma 4
    assistant folder (`Gemma4AssistantForCausalLM`, Google's or one `mtpspec train --kind
    gemma4-assistant` wrote) is loaded as an `AssistantDrafter` where the caller drafts chains
    with any drafter (`assistants`), and refused with the reason elsewhere."""
    if is_assistant_dir(head_dir):
        if not assistants:
            raise InputError(f"{head_dir} is a Gemma 4 assistant, not an mtpspec head: it drafts chains in "
                             "`mtpspec generate`, `bench`, `serve`, `acceptance`, `costs` and `data`; this needs an MTP head.")
        return load_assistant(head_dir, target)
    return MTPHead.from_pretrained(head_dir, target)


def load_head_config(head_dir: str | Path) -> HeadConfig:
    """The architecture of a saved head (without its weights)."""
    return saved_head_config(head_dir)


def save_recommended_k(head_dir: str | Path, dtype: str, k: int) -> dict[str, int]:
    """Record `k` as the head's measured best for `dtype` in its saved JSON (other dtypes kept)."""
    path = Path(head_dir) / CONFIG_NAME
    meta = json.loads(path.read_text())
    rec = meta.get("recommended_k")
    rec = dict(rec) if isinstance(rec, dict) else {}
    rec[dtype] = int(k)
    meta["recommended_k"] = rec
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return rec
