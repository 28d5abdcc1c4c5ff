"""What a decoding process holds in memory: the bytes the target and the head own (each
storage counted once: a tied LM head is its embedding; a GGUF target's blocks by their stored
size) and the process's resident set, now and at its peak."""

from __future__ import annotations

import resource
from typing import Any

from torch import nn


def owned_bytes(*modules: nn.Module | None) -> int:
    """Bytes of the parameters and buffers of `modules`, each storage once (shared or tied
    tensors, and tensors the modules share with each other, counted a single time)."""
    seen: set[int] = set()
    total = 0
    for m in modules:
        if m is None:
            continue
        for t in [*m.parameters(), *m.buffers()]:
            if t.is_meta:
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
    return total


def rss_bytes() -> tuple[int, int]:
    """(resident set now, its peak) of this process, in bytes (Linux /proc; the peak from getrusage)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    now = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    now = int(line.split()[1]) * 1024
    except OSError:
        pass
    return now, peak


def memory_report(target: Any, drafter: Any = None) -> dict[str, int]:
    """{"target_bytes", "head_bytes", "rss_bytes", "peak_rss_bytes"} for a `Target` and a drafter
    (its `head`, if it has one, is what it owns beyond the target; shared tensors count once,
    with the target)."""
    head = drafter if isinstance(drafter, nn.Module) else getattr(drafter, "head", None)
    tb = owned_bytes(target.model)
    hb = owned_bytes(target.model, head if isinstance(head, nn.Module) else None) - tb
    now, peak = rss_bytes()
    return {"target_bytes": tb, "head_bytes": hb, "rss_bytes": now, "peak_rss_bytes": peak}


def line(report: dict[str, int]) -> str:
    mb = 1e6
    return (f"memory: target {report['target_bytes'] / mb:.0f} MB, head {report['head_bytes'] / mb:.1f} MB; "
            f"process resident {report['rss_bytes'] / mb:.0f} MB (peak {report['peak_rss_bytes'] / mb:.0f} MB)")



