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
from torch import nn

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
        O, I = self.shape
        n, b = BLOCKS[self.qtype]
        if I % n:
            raise ValueError(f"a {NAMES[self.qtype]} row holds whole blocks of {n}; got {I} inputs")
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (O, I // n * b) or not self.data.is_contiguous():
            raise ValueError(f"{NAMES[self.qtype]} data must be contiguous uint8 ({O}, {I // n * b}); got "
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


class QuantLinear(nn.Module):
    """An `nn.Linear` whose weight stays as a GGUF file's blocks (`qweight`); a bias, if any,
    stays dense. The fused forward reads the blocks; this torch `forward` (the op-by-op path,
    tests) dequantizes them on each call to the very values a dense load holds, so both paths
    compute the same model."""

    def __init__(self, qweight: QTensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qweight = qweight
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("blocks", qweight.data, persistent=False)  # moves with the module; never cast (uint8)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., I) -> (..., O)
        return torch.nn.functional.linear(x, self.qweight.dequantize().to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qweight.name}"


class QuantEmbedding(nn.Module):
    """`nn.Embedding` over a GGUF file's blocks: a lookup dequantizes just the rows it reads,
    in `dtype` (the model's compute dtype), exactly as a dense table in that dtype holds them."""

    def __init__(self, qweight: QTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight, self.dtype = qweight, dtype
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.register_buffer("blocks", qweight.data, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (...,) -> (..., D)
        rows = self.qweight.dequantize(ids.reshape(-1).cpu()).to(self.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim).to(ids.device)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qweight.name}"


def attach(model: nn.Module, quantized: dict[str, QTensor], dtype: torch.dtype) -> nn.Module:
    """Swap the modules whose weights `quantized` holds (HF parameter names) for `QuantLinear` /
    `QuantEmbedding` over those blocks, in place; a tied LM head follows its embedding. Returns
    the model. Only plain `nn.Linear` / `nn.Embedding` modules are swapped (a scaled embedding
    keeps its own module, so nothing it computes is lost)."""
    for name, q in quantized.items():
        path, _, leaf = name.rpartition(".")
        if leaf != "weight":
            raise ValueError(f"{name}: only weight matrices are kept quantized")
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        old = getattr(parent, attr)
        if type(old) is nn.Embedding:
            setattr(parent, attr, QuantEmbedding(q, dtype))
        elif type(old) is nn.Linear:
            setattr(parent, attr, QuantLinear(q, None if old.bias is None or old.bias.is_meta else old.bias))
        else:
            raise ValueError(f"{path} is a {type(old).__name__}; only nn.Linear and nn.Embedding read quantized blocks")
    embed, head = model.get_input_embeddings(), getattr(model, "lm_head", None)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if isinstance(embed, QuantEmbedding) and tied and isinstance(head, nn.Linear) and "lm_head.weight" not in quantized:
        model.lm_head = QuantLinear(embed.qweight, None if head.bias is None or head.bias.is_meta else head.bias)
    return model
