"""A faster attention for batched Hugging Face generation on CPUs (the data writer's).

Letters: B rows, H query heads, Hk key/value heads, S cached positions, hd head dim.

In a decode step each of the B rows adds one token, whose query attends that row's cache.
PyTorch's fused CPU attention (`scaled_dot_product_attention`, HF's default "sdpa") runs
this shape slowly: for 96 rows x 9 heads over 178 cached positions (bf16, one thread) it took
17 ms, where two grouped matmuls with an fp32 softmax between them (`kernels.attention`,
"manual": the heads that share a key/value head are stacked, so the cache is read once per
group and never repeated) took 1.4 ms. Over 30 layers and every decode step that is most of
a batched generate's time. Prefill (several new tokens per row) stays on HF's "sdpa".

The two paths round differently, so greedy text differs from "sdpa"'s after a while (as any
change of kernel in bf16 does); a data set records which one wrote it and is extended with
the same one (`generate_data`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..core.kernels import attention

NAME = "mtpspec_grouped_decode"


def grouped_decode_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF's attention-function signature: query (B, H, Q, hd), key/value (B, Hk, S, hd), mask
    (B, 1, Q, S) bool (True = may attend) or None -> ((B, Q, H, hd), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    fused_only = kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None
    if query.shape[2] != 1 or fused_only or (dropout and module.training):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    B, S = key.shape[0], key.shape[2]
    if attention_mask is None:
        mask = torch.ones(B, 1, S, dtype=torch.bool, device=query.device)  # (B, 1, S): every cached position
    elif attention_mask.dtype == torch.bool:
        mask = attention_mask[:, 0]  # (B, 1, S)
    else:  # an additive float mask: 0 where allowed
        mask = attention_mask[:, 0] == 0
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = attention(query, key, value, mask, scale, "manual", kwargs.get("softcap"))  # (B, H, 1, hd)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make NAME a valid `attn_implementation` (its masks are HF's "sdpa" masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


@contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """Run `model` with attention `name` ("sdpa" or NAME), then give it back as it was."""
    before = model.config._attn_implementation
    if name == NAME:
        register()
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
