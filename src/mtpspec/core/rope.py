"""Rotary position embeddings, applied as Hugging Face's `apply_rotary_pos_emb` applies them.

Letters: T positions, hd head dim. The tables themselves come from the model's own rotary
module (`Target.rope_table`); this module only rotates by them, for the target's forward, the
fused forward and the head alike.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x (..., T, hd) rotated by the (..., T, hd) tables HF's rotary module returns, as HF's
    `apply_rotary_pos_emb` computes it, in x's dtype (OLMo 2's tables are fp32: the product is
    taken in fp32 and cast back). interleaved: Helium rotates pairs (0, 1), (2, 3), ..., by
    the first half of the table, each entry repeated twice."""
    if interleaved:
        half = cos.shape[-1] // 2
        cos, sin = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
        rot = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    else:
        rot = rotate_half(x)
    return (x * cos + rot * sin).to(x.dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """HF's sin table with its first half negated: `apply_rope_signed`'s form of the table."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), -1)


def apply_rope_signed(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`apply_rope` (not interleaved) with the sign of rotate_half moved into the table, which a
    forward negates once for all its layers: x2 * -s equals -x2 * s exactly (a sign flip
    rounds nothing), so the result is bit-identical with one call fewer per layer."""
    half = x.shape[-1] // 2
    return (x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * sin_signed).to(x.dtype)
