"""Where training computes: the CPU (the default) or a CUDA GPU (`mtpspec train --device`).

The data stays on the CPU (shards are memory-mapped there and collated there); each collated
batch moves to the device whole, the head (or draft model) and the frozen target live there, and
what is saved (checkpoints, the head, activation shards) is written from CPU copies.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import InputError

CHOICES = "cpu, cuda, cuda:N or auto"


def resolve_device(name: str | torch.device = "cpu") -> torch.device:
    """A `--device` value as a torch device, checked before any model loads: cpu; cuda (under
    torchrun, each rank takes the GPU of its LOCAL_RANK) or cuda:N; auto (cuda where PyTorch
    sees a GPU, else cpu)."""
    text = str(name).strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise InputError(f"--device {name!r} is not one of {CHOICES}.")
    if not torch.cuda.is_available():
        why = "this PyTorch was built without CUDA" if torch.version.cuda is None else "it sees no GPU"
        raise InputError(f"--device {name} needs a CUDA GPU, but PyTorch {torch.__version__} cannot use one here "
                         f"({why}). Use --device cpu (the default) or auto.")
    n = torch.cuda.device_count()
    i = int(index) if index else int(os.environ.get("LOCAL_RANK", "0"))
    if i >= n:
        raise InputError(f"--device {name}: GPU {i} does not exist; PyTorch sees {n} (cuda:0 to cuda:{n - 1}).")
    return torch.device("cuda", i)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A collated batch's tensors on `device` (the same dict where it is the CPU)."""
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def autocast(device: torch.device, enabled: bool) -> Any:
    """bf16 autocast for the device the tensors are on: a CPU autocast leaves CUDA ops in fp32,
    and a CUDA autocast every CPU op."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def process_group_backend(device: torch.device) -> str:
    """NCCL for GPU ranks; gloo for CPU tensors (NCCL refuses them, CUDA present or not)."""
    return "nccl" if device.type == "cuda" else "gloo"
