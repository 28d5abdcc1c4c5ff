"""Heads shipped with the package, one folder per embedded target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.head import CONFIG_NAME

HERE = Path(__file__).parent

# Used when a head records no measured choice: a safe middle of the k sweep.
FALLBACK_K = 3


def shipped_head_dir(target_name: str) -> Path | None:
    d = HERE / target_name
    return d if (d / CONFIG_NAME).is_file() else None


def default_k(head: Any) -> int:
    """Drafts per round: the k measured best for this head (saved as `recommended_k`, either
    one int or one per dtype, e.g. {"float32": 4, "bfloat16": 2}: the cost of verifying k + 1
    tokens depends on the dtype's kernels).

    A recorded 0 means no k measured faster than plain decoding for that dtype: plain decoding
    it is (the output is the same either way)."""
    rec = getattr(head, "recommended_k", None)
    if isinstance(rec, dict):
        dtype = str(next(head.parameters()).dtype).removeprefix("torch.")
        rec = rec.get(dtype)
    return FALLBACK_K if rec is None else int(rec)


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
