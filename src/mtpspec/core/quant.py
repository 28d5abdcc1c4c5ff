"""A GGUF file's quantized matrices, kept as the file stores them (blocks of low-bit integers
with their scales) so that the fused forward reads a third (bf16) or a sixth (fp32) of the
bytes a dense copy would cost, and dequantizes each block in registers to the very values a
dense load would hold.

Letters: O output rows, I inputs per row (a multiple of the type's block size).

A `QTensor` is one weight matrix in Hugging Face's row order (q/k rows already un-permuted
from llama.cpp's layout): `data` holds row o's blocks at `data[o]`, `row_bytes` each.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import numpy as np
import torch

# GGML type ids (ggml.h) -> (elements per block, bytes per block)
BLOCKS = {
    2: (32, 18),  # Q4_0: fp16 d, 16 bytes of nibbles
    3: (32, 20),  # Q4_1: fp16 d, fp16 m, 16 bytes of nibbles
    8: (32, 34),  # Q8_0: fp16 d, 32 int8
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
}
NAMES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}


@dataclass(frozen=True)
class QTensor:
    """One quantized weight matrix (O, I), rows in HF's order, blocks as the file stores them."""

    qtype: int  # a GGML type id, one of BLOCKS
    shape: tuple[int, int]  # (O, I)
    data: torch.Tensor  # (O, row_bytes) uint8, contiguous; may be a view of the mapped file

    def __post_init__(self) -> None:
        if self.qtype not in BLOCKS:
            raise ValueError(f"GGML type {self.qtype} is not one the quantized kernels read ({sorted(NAMES.values())})")
        rows, inputs = self.shape
        n, b = BLOCKS[self.qtype]
        if inputs % n:
            raise ValueError(f"a {NAMES[self.qtype]} row holds whole blocks of {n}; got {inputs} inputs")
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (rows, inputs // n * b) or not self.data.is_contiguous():
            raise ValueError(f"{NAMES[self.qtype]} data must be contiguous uint8 ({rows}, {inputs // n * b}); got "
                             f"{self.data.dtype} {tuple(self.data.shape)}")

    @property
    def name(self) -> str:
        return NAMES[self.qtype]

    @property
    def row_bytes(self) -> int:
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The fp32 values a dense load holds (gguf-py's own dequantization): all rows, or
        `rows` (R,) -> (R, I). The reference every kernel here is checked against."""
        from gguf import GGMLQuantizationType, dequantize

        data = self.data if rows is None else self.data[rows]
        out = dequantize(data.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(-1, self.shape[1])


# The C side's description of a weight matrix (fused.c: Part, Mat): up to three parts stacked
# along the outputs (q, k, v; gate, up), each dense (the compute dtype, row-major) or quantized.
DENSE = 0
MAX_PARTS = 3


class Part(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("type", ctypes.c_int), ("rows", ctypes.c_int), ("row_bytes", ctypes.c_long)]


class Mat(ctypes.Structure):
    _fields_ = [("nparts", ctypes.c_int), ("part", Part * MAX_PARTS)]


Matrix = Union[torch.Tensor, QTensor]  # noqa: UP007 (a runtime alias)


def mat(parts: Sequence[Matrix], dtype: torch.dtype) -> Mat:
    """A `Mat` over `parts` stacked along the outputs: dense parts must be contiguous `dtype`
    (the compute dtype), quantized ones `QTensor`s; all share one input width. The tensors must
    outlive the returned struct (it holds their addresses)."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"a matrix has 1 to {MAX_PARTS} parts; got {len(parts)}")
    widths = {int(p.shape[1]) for p in parts}
    if len(widths) > 1:
        raise ValueError(f"the parts of a matrix share one input width; got {sorted(widths)}")
    m = Mat(nparts=len(parts))
    for i, p in enumerate(parts):
        if isinstance(p, QTensor):
            m.part[i] = Part(p.data.data_ptr(), p.qtype, p.shape[0], p.row_bytes)
        else:
            if p.dtype != dtype or not p.is_contiguous() or p.dim() != 2:
                raise ValueError(f"a dense part must be a contiguous 2-D {dtype} tensor; got {p.dtype} {tuple(p.shape)}")
            m.part[i] = Part(p.data_ptr(), DENSE, p.shape[0], p.shape[1] * p.element_size())
    return m


def rows(parts: Sequence[Matrix]) -> int:
    return sum(int(p.shape[0]) for p in parts)


def nbytes(t: Matrix) -> int:
    """The bytes a forward reads of one weight matrix: stored blocks, or the dense tensor."""
    return t.nbytes if isinstance(t, QTensor) else t.numel() * t.element_size()
