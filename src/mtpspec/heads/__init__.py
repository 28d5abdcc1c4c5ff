"""Heads shipped with the package, one folder per embedded target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..head import CONFIG_NAME

HERE = Path(__file__).parent

# Used when a head records no measured choice: a safe middle of the k sweep.
FALLBACK_K = 3


def shipped_head_dir(target_name: str) -> Path | None:
    d = HERE / target_name
    return d if (d / CONFIG_NAME).is_file() else None


def default_k(head: Any) -> int:
    """Drafts per round: the k the head's bench sweep picked (saved as `recommended_k`)."""
    return int(getattr(head, "recommended_k", None) or FALLBACK_K)
