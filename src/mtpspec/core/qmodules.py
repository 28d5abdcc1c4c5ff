"""Modules over a GGUF file's quantized blocks (`quant.QTensor`), swapped into a Hugging Face
model in place of its `nn.Linear` / `nn.Embedding` (`attach`), so that the model holds no dense
copy of them. The fused forward reads their blocks directly (`Target.weights()` lists them as
`Projection` parts); their own torch `forward`s, for the op-by-op path, dequantize to the same
values a dense load holds."""

from __future__ import annotations

import torch
from torch import nn

from .fused import quantized_rows
from .quant import QTensor


def dense_weight(q: QTensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole (O, I) matrix in `dtype`, freshly dequantized (by fused.c where it runs here)."""
    rows = quantized_rows(q, torch.arange(q.shape[0]), dtype) if dtype in (torch.bfloat16, torch.float32) else None
    return q.dequantize().to(dtype) if rows is None else rows


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
        return torch.nn.functional.linear(x, dense_weight(self.qweight, x.dtype).to(x.device), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qweight.name}"


def dequantized_rows(q: QTensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(...,) ids -> (n, I) those rows of `q` in `dtype` on the CPU, as a dense table in `dtype`
    holds them: by fused.c where it runs (the values the matmuls multiply by), else gguf-py."""
    ids = ids.reshape(-1).cpu()
    rows = quantized_rows(q, ids, dtype) if dtype in (torch.bfloat16, torch.float32) else None
    return q.dequantize(ids).to(dtype) if rows is None else rows


class QuantEmbedding(nn.Module):
    """`nn.Embedding` over a GGUF file's blocks: a lookup dequantizes just the rows it reads,
    in `dtype` (the model's compute dtype), exactly as a dense table in that dtype holds them."""

    def __init__(self, qweight: QTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight, self.dtype = qweight, dtype
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.register_buffer("blocks", qweight.data, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (...,) -> (..., D)
        return dequantized_rows(self.qweight, ids, self.dtype).reshape(*ids.shape, self.embedding_dim).to(ids.device)

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
