"""This machine's memory bandwidth, and the bytes a target's forward must read: the physical
limit of decoding, side by side with what a forward costs (`mtpspec costs`).

A one-token forward of a small model reads every weight matrix once and does little arithmetic
with each byte, so it cannot run faster than (bytes of those matrices) / (memory bandwidth).
The bandwidth is measured on its own, not from a model forward: a streaming read of a buffer
much larger than the last-level cache (1 GiB by default), several passes, with as many threads
as the forward uses (torch's). The read is `stream.c`, built with the project's native helper;
where it cannot be built (no compiler, no AVX2), `Tensor.sum` over the same buffer.
"""

from __future__ import annotations

import ctypes
import functools
import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..core import native
from ..errors import InputError

SOURCE = Path(__file__).with_name("stream.c")
FLAGS = ("-O3", "-mavx2", "-fopenmp", "-shared", "-fPIC")
BUFFER_BYTES = 1 << 30  # 1 GiB: far beyond any CPU's last-level cache (tens to hundreds of MiB)
PASSES = 5
KERNELS = ("auto", "c", "torch")


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float  # the best pass: the most this machine streamed, the limit to compare with
    median_bytes_per_s: float  # the median pass
    buffer_bytes: int  # bytes read per pass
    passes: int  # timed passes (after one untimed)
    threads: int
    kernel: str  # "c" (stream.c) or "torch" (Tensor.sum)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """(stream.c compiled and loaded, None), or (None, why not)."""
    so, why = native.build(SOURCE, FLAGS, {"avx2"})
    if so is not None:
        so.stream_read.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
        so.stream_read.restype = ctypes.c_uint64
    return so, why


def measure_bandwidth(buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES, threads: int | None = None,
                      kernel: str = "auto") -> Bandwidth:
    """Read a `buffer_bytes` buffer `passes` times (after one untimed pass) with `threads`
    threads (default: torch's), and return the bytes per second of the best and median pass.
    kernel: "c" (stream.c), "torch" (Tensor.sum), or "auto" (c where it builds, else torch)."""
    if kernel not in KERNELS:
        raise InputError(f"kernel must be one of {', '.join(KERNELS)}, not {kernel!r}.")
    if buffer_bytes < 8 or passes < 1:
        raise InputError(f"the bandwidth needs a buffer of >= 8 bytes and >= 1 pass; got {buffer_bytes} and {passes}.")
    threads = torch.get_num_threads() if threads is None else threads
    so, why = _library() if kernel != "torch" else (None, None)
    if kernel == "c" and so is None:
        raise InputError(f"the streaming read kernel is unavailable here: {why}")
    words = torch.ones(buffer_bytes // 8, dtype=torch.int64)  # every page written, so none faults while timed
    if so is not None:
        def read() -> None:
            so.stream_read(words.data_ptr(), words.numel(), threads)
    else:
        floats = words.view(torch.float32)

        def read() -> None:
            with _torch_threads(threads):
                floats.sum()
    read()
    seconds = []
    for _ in range(passes):
        t0 = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - t0)
    nbytes = words.numel() * 8
    return Bandwidth(bytes_per_s=nbytes / min(seconds), median_bytes_per_s=nbytes / statistics.median(seconds),
                     buffer_bytes=nbytes, passes=passes, threads=threads, kernel="c" if so is not None else "torch")


class _torch_threads:
    """torch's thread count set to n inside the block, restored after."""

    def __init__(self, n: int) -> None:
        self.n, self.old = n, torch.get_num_threads()

    def __enter__(self) -> None:
        torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.old)


# -- what a forward reads ----------------------------------------------------------------------
def matrix_bytes(m: Any) -> int:
    """Bytes a weight matrix occupies as the forward reads it: a dense tensor's elements, a
    quantized matrix's stored blocks (`core.quant.QTensor.nbytes`), or the sum over parts
    stacked as one matrix (a list or tuple of either)."""
    if isinstance(m, torch.Tensor):
        return m.numel() * m.element_size()
    if isinstance(m, (list, tuple)):
        return sum(matrix_bytes(p) for p in m)
    nbytes = getattr(m, "nbytes", None)
    if not isinstance(nbytes, int):
        raise TypeError(f"not a weight matrix (a tensor, or quantized blocks with .nbytes): {type(m).__name__}")
    return nbytes


def forward_matrices(target: Any) -> list[Any]:
    """The weight matrices one forward of `target` (a `Target`) reads: every decoder layer's
    projections (q, k, v, o, gate, up, down) and the LM head, which a tied model shares with the
    embedding. The embedding itself is not streamed: a forward reads one row per token. Norm
    scales and biases (vectors, a fraction of a percent) are left out."""
    w = target.weights()
    mats = [p.matrices for layer in w.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return [*mats, w.lm_head.matrices]


def forward_bytes(matrices: Iterable[Any]) -> int:
    """Bytes of weights a forward reads: the sum of `matrix_bytes` over its matrices."""
    return sum(matrix_bytes(m) for m in matrices)


@dataclass(frozen=True)
class MemoryLimit:
    """One forward's weight bytes over this machine's bandwidth: the fastest a forward can be
    when it reads every weight once from memory, beside the time measured for it."""

    weight_bytes: int  # bytes of the weight matrices one forward reads (`forward_bytes`)
    bandwidth: Bandwidth
    forward_s: float  # the measured one-token forward

    @property
    def limit_s(self) -> float:
        return self.weight_bytes / self.bandwidth.bytes_per_s

    @property
    def ratio(self) -> float:
        """Measured time over the bandwidth limit: 1.0 = at the limit."""
        return self.forward_s / self.limit_s if self.limit_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"weight_bytes": self.weight_bytes, "bandwidth": self.bandwidth.to_dict(),
                "bandwidth_limit_ms": self.limit_s * 1e3, "forward_ms": self.forward_s * 1e3,
                "forward_over_limit": self.ratio}

    def line(self) -> str:
        b = self.bandwidth
        return (f"  memory: {self.weight_bytes / 1e6:.1f} MB of weights read per forward at {b.bytes_per_s / 1e9:.1f} GB/s "
                f"(best of {b.passes} streaming reads of {b.buffer_bytes / 2**20:.0f} MiB, {b.threads} threads, "
                f"median {b.median_bytes_per_s / 1e9:.1f}) = {self.limit_s * 1e3:.2f} ms bandwidth limit; measured "
                f"one-token forward {self.forward_s * 1e3:.2f} ms = {self.ratio:.2f}x the limit")
