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
# The same blocks regrouped for 8-bit activations (`--dtype q8`, fused.c's matmul_q8): type id
# 0x100 + the file's, and bytes per 16 outputs x 32 inputs (the file's bytes for 16 blocks).
PACKED = {0x102: 288, 0x103: 320, 0x108: 544}
COLS = 16  # outputs per packed column group
NAMES.update({t: f"{NAMES[t & 0xFF]}/q8" for t in PACKED})


@dataclass(frozen=True)
class QTensor:
    """One quantized weight matrix (O, I), rows in HF's order, blocks as the file stores them."""

    qtype: int  # a GGML type id, one of BLOCKS
    shape: tuple[int, int]  # (O, I)
    data: torch.Tensor  # (O, row_bytes) uint8, contiguous; may be a view of the mapped file

    def __post_init__(self) -> None:
        if self.qtype not in BLOCKS and self.qtype not in PACKED:
            raise ValueError(f"GGML type {self.qtype} is not one the quantized kernels read ({sorted(NAMES.values())})")
        rows, inputs = self.shape
        n, b = BLOCKS[self.qtype & 0xFF]
        if inputs % n:
            raise ValueError(f"a {NAMES[self.qtype]} row holds whole blocks of {n}; got {inputs} inputs")
        want = (rows, inputs // n * b) if self.packed_for is None else (-(-rows // COLS), inputs // n * PACKED[self.qtype])
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want or not self.data.is_contiguous():
            raise ValueError(f"{NAMES[self.qtype]} data must be contiguous uint8 {want}; got "
                             f"{self.data.dtype} {tuple(self.data.shape)}")

    @property
    def packed_for(self) -> str | None:
        """"q8" where the blocks are regrouped for 8-bit activations (`pack`), else None."""
        return "q8" if self.qtype in PACKED else None

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

        if self.packed_for is not None:
            return unpack(self).dequantize(rows)
        data = self.data if rows is None else self.data[rows]
        out = dequantize(data.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(-1, self.shape[1])

    def take(self, ids: torch.Tensor) -> QTensor:
        """Rows `ids` (R,) as a QTensor of their own, in this one's layout."""
        if self.packed_for is None:
            return QTensor(self.qtype, (int(ids.numel()), self.shape[1]), self.data[ids].contiguous())
        return pack(unpack(self).take(ids))


def quantize_q8_0(w: torch.Tensor) -> QTensor:
    """A dense (O, I) matrix (I a multiple of 32) as Q8_0 blocks, as llama.cpp quantizes one: per
    32 weights d = max|w| / 127 (stored fp16), q = w / d rounded to nearest (ties to even)."""
    O, I = w.shape  # noqa: E741 (the module's letters)
    if I % 32:
        raise ValueError(f"Q8_0 needs inputs in blocks of 32; got {I}")
    x = w.detach().float().numpy().reshape(O, I // 32, 32)
    d = np.abs(x).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    qs = np.clip(np.rint(x * inv), -127, 127).astype(np.int8)
    raw = np.concatenate([d.astype(np.float16).view(np.uint8), qs.view(np.uint8)], -1)  # (O, G, 34)
    return QTensor(8, (O, I), torch.from_numpy(np.ascontiguousarray(raw.reshape(O, -1))))


def packed_type(q: QTensor) -> int:
    """The type id of `q`'s blocks packed for 8-bit activations; a ValueError for a type without a kernel."""
    kind = 0x100 + q.qtype
    if kind not in PACKED:
        have = ", ".join(NAMES[t & 0xFF] for t in PACKED)
        raise ValueError(f"8-bit activations compute on {have} blocks, not {q.name}")
    return kind


def pack(q: QTensor) -> QTensor:
    """`q`'s blocks regrouped for 8-bit activations (fused.c's layout, `PACKED`): the same bytes
    per weight, 16 outputs side by side per group of 32 inputs. Outputs are padded with zero
    blocks to a multiple of 16. Q4_0, Q4_1 and Q8_0 only. In numpy: `fused.packed` gives the same
    bytes in C where the fused library runs (twice as fast)."""
    kind = packed_type(q)
    O, I = q.shape  # noqa: E741 (the module's letters)
    G, C = I // 32, -(-O // COLS)
    raw = q.data.numpy().reshape(O, G, -1)
    raw = np.concatenate([raw, np.zeros((C * COLS - O, G, raw.shape[2]), np.uint8)]).reshape(C, COLS, G, -1)
    scales = [raw[..., 0:2]] + ([raw[..., 2:4]] if q.qtype == 3 else [])  # d (Q4_1: and m), each (C, 16, G, 2)
    if q.qtype == 8:  # chunk j, lane n, byte b: weight (n, 4j + b) + 128
        body = (raw[..., 2:34] ^ 0x80).reshape(C, COLS, G, 8, 4).transpose(0, 2, 3, 1, 4).reshape(C, G, 512)
    else:  # chunk j, lane n, byte b: weight (n, 8j + b) low, (n, 8j + 4 + b) high
        qs = raw[..., 2 * len(scales):2 * len(scales) + 16]
        u = np.concatenate([qs & 15, qs >> 4], -1).reshape(C, COLS, G, 4, 2, 4).transpose(0, 2, 3, 1, 5, 4)
        body = (u[..., 0] | u[..., 1] << 4).reshape(C, G, 256)
    parts = [body] + [sc.transpose(0, 2, 1, 3).reshape(C, G, 2 * COLS) for sc in scales]
    data = np.ascontiguousarray(np.concatenate(parts, -1).reshape(C, G * PACKED[kind]))
    return QTensor(kind, q.shape, torch.from_numpy(data))


def unpack(q: QTensor) -> QTensor:
    """`pack`'s inverse: the blocks as the file stores them."""
    O, I = q.shape  # noqa: E741 (the module's letters)
    G, C, base = I // 32, -(-O // COLS), q.qtype & 0xFF
    cell = q.data.numpy().reshape(C, G, PACKED[q.qtype])
    nsc = 2 if base == 3 else 1
    body, sc = cell[..., :-2 * COLS * nsc], cell[..., -2 * COLS * nsc:]
    scales = [sc[..., 2 * COLS * i:2 * COLS * (i + 1)].reshape(C, G, COLS, 2).transpose(0, 2, 1, 3) for i in range(nsc)]
    if base == 8:
        qs = [body.reshape(C, G, 8, COLS, 4).transpose(0, 3, 1, 2, 4).reshape(C, COLS, G, 32) ^ 0x80]
    else:
        b = body.reshape(C, G, 4, COLS, 4).transpose(0, 3, 1, 2, 4)  # (C, 16, G, j, b)
        u = np.stack([b & 15, b >> 4], -2).reshape(C, COLS, G, 32)  # weight 8j + 4h + b
        qs = [u[..., :16] | u[..., 16:] << 4]
    raw = np.concatenate(scales + qs, -1).reshape(C * COLS, G * BLOCKS[base][1])[:O]
    return QTensor(base, q.shape, torch.from_numpy(np.ascontiguousarray(raw)))


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
