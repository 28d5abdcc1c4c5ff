"""What Gemma 4's text decoder adds to the families `target.py` runs alike, read off its modules
and config (`Gemma4ForCausalLM`, model_type "gemma4_text"); the torch forward applies each in
one place.

Letters: T new tokens, N decoder layers, D hidden size, P per-layer input width, Hk key/value
heads, hd head dim.

- Head shapes per layer: full-attention layers have wider heads (`global_head_dim`) and, with
  `attention_k_eq_v`, their own number of key/value heads, so the cache is layered
  (`KVCache.layered`).
- Values: with `attention_k_eq_v` a full-attention layer has no v_proj and its values are the
  key projection's output (before the key norm); every layer normalizes its values with a
  scale-free RMSNorm (`v_norm`).
- KV sharing (the E-series): the last `num_kv_shared_layers` layers compute no keys or values;
  each reads those of the last earlier layer of its own type, which its cache entry aliases.
- Per-layer inputs (PLE, the E-series): a second embedding of the token, mixed with a
  projection of the first, feeds a small gated residual branch after each layer's MLP.
- `layer_scalar`: each layer's output is scaled by a fixed per-layer number.
- RoPE: the full-attention layers rotate only part of each head ("proportional", a quarter by
  default), as a table whose other frequencies are 0, i.e. cos = 1 and sin = 0: rotating the
  whole head by it leaves those dimensions exactly as they were.
- Mixture-of-experts layers (`enable_moe_block`, the 26B-A4B) are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UnsupportedModelError

MODEL_TYPE = "gemma4_text"
# "own": the layer projects keys and values; "k": its values are its key projection (k_eq_v);
# "shared": it projects neither and reads those of layer `source`.
KV_KINDS = ("own", "k", "shared")


@dataclass(frozen=True)
class PerLayerInput:
    """A layer's PLE branch: x += norm(proj(act(gate(x)) * per_layer_input)), all the model's modules."""

    gate: nn.Linear  # (P, D)
    proj: nn.Linear  # (D, P)
    norm: nn.Module
    act: nn.Module


def check(cfg: object) -> None:
    """Refuse what the adapter does not run, with the reason."""
    if getattr(cfg, "enable_moe_block", False):
        raise UnsupportedModelError("Gemma 4 with mixture-of-experts layers (enable_moe_block=True, e.g. the "
                                    "26B-A4B) is not supported: mtpspec runs dense MLPs only.")


def store_layers(cfg: object) -> dict[str, int]:
    """Layer type -> the last layer of that type that computes its own keys and values ("store"
    in HF's `kv_sharing_modes`): what the model's KV-shared layers, and a Gemma 4 assistant's
    layers, attend."""
    modes, types = cfg.kv_sharing_modes, cfg.layer_types  # type: ignore[attr-defined]
    return {types[i]: i for i, mode in enumerate(modes) if mode == "store"}


def kv_sources(cfg: object) -> list[int]:
    """Per layer, the layer whose keys and values it attends: itself, or (a KV-shared layer, HF's
    "reuse") the store layer of its type."""
    n = int(cfg.num_hidden_layers)  # type: ignore[attr-defined]
    if int(getattr(cfg, "num_kv_shared_layers", 0) or 0) >= n:
        raise UnsupportedModelError("a Gemma 4 model whose every layer shares another's keys and values is an "
                                    "assistant (drafter), not a target.")
    try:
        modes, stores = cfg.kv_sharing_modes, store_layers(cfg)  # type: ignore[attr-defined]
    except ValueError as e:  # HF's own check: a shared layer type that no earlier layer computes
        raise UnsupportedModelError(f"Gemma 4 KV sharing: {e}") from None
    types = cfg.layer_types  # type: ignore[attr-defined]
    return [stores[types[i]] if mode == "reuse" else i for i, mode in enumerate(modes)]


def kv_kind(attn: nn.Module) -> str:
    """Which of KV_KINDS a Gemma 4 attention module is."""
    if getattr(attn, "is_kv_shared_layer", False):
        return "shared"
    return "k" if getattr(attn, "v_proj", None) is None else "own"


def per_layer_input(layer: nn.Module) -> PerLayerInput | None:
    if not getattr(layer, "hidden_size_per_layer_input", 0):
        return None
    return PerLayerInput(gate=layer.per_layer_input_gate, proj=layer.per_layer_projection,
                         norm=layer.post_per_layer_input_norm, act=layer.act_fn)


def per_layer_inputs(model: nn.Module, ids: torch.Tensor, x: torch.Tensor,
                     linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor | None:
    """(1, T) ids and (T, D) embeddings -> (T, N, P) the per-layer inputs, as HF's
    `get_per_layer_inputs` and `project_per_layer_inputs` compute them, the projection through
    `linear` (the target's row-invariant matmul); None where the model has none."""
    m = model.model
    P = int(getattr(m, "hidden_size_per_layer_input", 0) or 0)
    if not P:
        return None
    T, N = x.shape[0], len(m.layers)
    token = m.embed_tokens_per_layer(ids[0]).reshape(T, N, P)  # (T, N, P): the token's own, scaled
    proj = linear(x, m.per_layer_model_projection.weight) * m.per_layer_model_projection_scale  # (T, N * P)
    proj = m.per_layer_projection_norm(proj.reshape(T, N, P))  # (T, N, P)
    return (proj + token) * m.per_layer_input_scale


def apply_per_layer_input(x: torch.Tensor, ple: PerLayerInput, inp: torch.Tensor,
                          linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """(T, D) hidden, (T, P) this layer's per-layer input -> (T, D) after the PLE branch."""
    h = ple.act(linear(x, ple.gate.weight)) * inp  # (T, P)
    return x + ple.norm(linear(h, ple.proj.weight))  # (T, D)
