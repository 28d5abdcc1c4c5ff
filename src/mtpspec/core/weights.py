"""What a forward reads of the target: its weights as plain data, by reference (no copies).

Letters: D hidden size, H query heads, Hk key/value heads, hd head dim, M MLP width,
V vocabulary.

`Target.weights()` describes the decoder stack it runs in these terms, and both forwards read
them: the op-by-op torch path (`Target.forward`) and the fused C path (`fused.FusedForward`).
A field is a reference to the model's own tensor (a norm's weight is its `nn.Parameter`
itself), so a weight given new data in place is seen by every reader, and a reader that keeps
raw pointers (the fused forward) can tell that it changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quant import Matrix, QTensor


@dataclass(frozen=True)
class Projection:
    """y = x @ weight.T + bias. Where the model keeps a GGUF file's quantized blocks (`load_target(...,
    weights="gguf")`), `parts` lists the matrices stacked along the outputs (q, k, v; gate, up),
    each a dense tensor or a `QTensor`, and `weight` is None: no dense copy exists."""

    weight: torch.Tensor | None  # (O, I); None where `parts` holds quantized matrices
    bias: torch.Tensor | None = None  # (O,); None = no bias
    parts: tuple[Matrix, ...] = ()  # the stacked matrices, when any is quantized

    @property
    def matrices(self) -> tuple[Matrix, ...]:
        """What the forward multiplies by, stacked along the outputs: (weight,) when dense."""
        if self.parts:
            return self.parts
        assert self.weight is not None
        return (self.weight,)

    @property
    def quantized(self) -> bool:
        return any(isinstance(m, QTensor) for m in self.parts)

    @property
    def out_features(self) -> int:
        return sum(int(m.shape[0]) for m in self.matrices)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The (O, I) weight in `dtype`: itself, or its quantized parts dequantized (exactly
        the values a dense load holds; a fresh tensor each call, for the op-by-op path)."""
        if self.weight is not None:
            return self.weight
        return torch.cat([m.dequantize().to(dtype) if isinstance(m, QTensor) else m for m in self.parts])


@dataclass(frozen=True)
class Norm:
    """A norm's scale and epsilon. Which formula uses them is `TargetWeights.llama_norms`."""

    weight: torch.Tensor  # (D,), or (H * hd,) / (hd,) for a q/k norm
    eps: float


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer. A pre-norm layer (Llama) has attn_norm and mlp_norm only; OLMo 2
    normalizes the sublayers' outputs only; Gemma 2/3 do both."""

    attn_norm: Norm | None  # on attention's input (None: OLMo 2)
    mlp_norm: Norm | None  # on the MLP's input (None: OLMo 2)
    attn_out_norm: Norm | None  # on attention's output, before the residual add (OLMo 2, Gemma)
    mlp_out_norm: Norm | None  # on the MLP's output, before the residual add (OLMo 2, Gemma)
    q_norm: Norm | None  # on the queries (Qwen3, Gemma 3, OLMo 2); None: none
    k_norm: Norm | None  # on the keys, wherever q_norm is
    qk_norm_whole: bool  # q/k norms span all heads at once, before the head split (OLMo 2)
    qkv: Projection  # q, k and v stacked: (H * hd + 2 * Hk * hd, D), q rows first
    o: Projection  # (D, H * hd)
    gate_up: Projection  # gate and up stacked: (2 * M, D), gate rows first
    down: Projection  # (D, M)
    activation: str  # the MLP's gate activation: "silu", else the module's class name
    scale: float  # attention scores are q.k * scale (the module's own `scaling`)
    rope: str | None  # which rotary table (`Target.rope_table`; "" = the model's only one); None = no RoPE
    window: int | None  # sliding window: a key is visible iff its position > the query's - window; None = full

    @property
    def has_rope(self) -> bool:
        return self.rope is not None


@dataclass(frozen=True)
class TargetWeights:
    """The decoder stack after the embedding: its layers, the final norm and the LM head."""

    layers: tuple[LayerWeights, ...]
    final_norm: Norm
    lm_head: Projection  # (V, D)
    # Every norm computes weight * normalize(x).to(dtype), Llama's RMSNorm; else each norm is
    # its family's own form (OLMo 2 and Helium scale before the cast, Gemma by 1 + weight).
    llama_norms: bool
