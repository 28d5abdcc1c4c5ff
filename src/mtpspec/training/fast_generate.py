"""Faster batched Hugging Face generation on CPUs (the data writer's), in two parts.

Letters: B rows, H query heads, Hk key/value heads, S cached positions, hd head dim, V
vocabulary, K candidates.

Where a batch of 192 seeds spent its time (bf16, one thread): the sampled stage (the target
writing its own user turns, 96 steps) took 1.29 s per step against ~0.25 s for a greedy step
over 73-79 rows, because HF's top-p sorts the whole vocabulary of every row (0.75 s for
192 x 49,152 here) and samples over all of it (0.17 s). That stage was 37% of the batch.

1. `NucleusSampler`: the same nucleus (top-p) sampling from the K most likely tokens only
   (`torch.topk`, 0.04 s), with the whole vocabulary's normaliser; a row whose nucleus does
   not fit in K falls back to the full sort, so the distribution is exactly top-p's.
2. `grouped_decode_attention`: in a decode step each of the B rows adds one token, whose
   query attends that row's cache with two grouped matmuls and an fp32 softmax between them
   (`kernels.attention`, "manual": heads that share a key/value head are stacked, so the
   cache is read once per group). Alone, for 96 rows x 9 heads over 178 positions, it took
   1.4 ms where PyTorch's fused CPU kernel ("sdpa") took 17 ms; inside a whole greedy step,
   where matmuls and reading the cache dominate, it saved 0-10% (`reports/training/data-speed/`).
   Prefill (several new tokens per row) stays on HF's "sdpa".

The attention kernels round differently, so greedy text differs from "sdpa"'s after a while
(as any change of kernel in bf16 does), and the sampler draws other random numbers than HF's:
a data set records how it was generated (`generation`) and is extended the same way
(`generate_data`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..core.kernels import attention

NAME = "mtpspec_grouped_decode"
SAMPLING = "nucleus-topk"
BATCHING = "length-buckets"


def generation(model: Any) -> dict[str, str]:
    """What a data set's manifest records about how `model` generates it (absent in sets
    written before this module: HF's own attention and sampling). The grouped decode attention
    stands in for "sdpa" only; a model HF runs otherwise (Gemma 2's soft-capped scores run
    "eager") keeps its own attention."""
    own = model.config._attn_implementation
    return {"attention": NAME if own in ("sdpa", NAME) else own, "sampling": SAMPLING, "batching": BATCHING}


def length_buckets(lengths: list[int], max_new: int, row_cost: int = 64, bucket_cost: int = 4096) -> list[list[int]]:
    """Split a batch of left-padded rows into generate calls by length: row indices, shortest
    first, cut where that lowers sum(rows x (longest + max_new / 2 + row_cost)) + calls x
    bucket_cost (optimal, by dynamic programming over the sorted lengths).

    Why: a batched decode step reads (and HF's cache copies) every row's cache at the padded
    width, so one 586-token passage made 178 rows of a median 69 tokens attend ~600 positions
    each: 48 steps took 672 s in one call, 195 s in four length buckets (fp32, 2 threads, an
    AVX2 EPYC). The writer's own calls (one per stage) mix lengths far less: there a whole
    batch wrote no faster (`reports/training/data-speed/`); buckets pay where a stage mixes short and long
    prompts (`--prompts-file`, `--passages`). row_cost stands for a row's matmuls in units of
    cached positions, bucket_cost for a call's fixed per-step cost; both rough, they only place
    the cuts."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of rows order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        width = lengths[order[j - 1]] + max_new / 2 + row_cost  # the longest of a bucket ending at j
        for i in range(j):
            c = best[i] + (j - i) * width + bucket_cost
            if c < best[j]:
                best[j], cut[j] = c, i
    buckets, j = [], n
    while j:
        buckets.append(order[cut[j]:j])
        j = cut[j]
    return buckets[::-1]


class NucleusSampler:
    """An HF logits processor that *samples*: temperature, then top-p, from the top `k`
    candidates; it returns scores that are 0 at the drawn token and -inf elsewhere, so HF's
    greedy step (`do_sample=False`) emits the draw. Draws from torch's global generator, as
    HF's sampling does, so seeding it per batch keeps a run reproducible."""

    def __init__(self, temperature: float, top_p: float, k: int = 256):
        if temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError(f"NucleusSampler needs temperature > 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
        self.temperature, self.top_p, self.k = temperature, top_p, k

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        z = scores.float() / self.temperature  # (B, V)
        lse = torch.logsumexp(z, -1, keepdim=True)  # (B, 1): the whole vocabulary's normaliser
        top, idx = torch.topk(z, min(self.k, z.shape[-1]), -1)  # (B, K) descending
        p = (top - lse).exp()  # (B, K): the candidates' probabilities
        spill = p.sum(-1) < self.top_p  # (B,): the nucleus reaches past the K candidates
        if bool(spill.any()):
            rows = spill.nonzero()[:, 0]
            zs, ids = torch.sort(z[rows], -1, descending=True)  # (b, V)
            draw_full = self._draw((zs - lse[rows]).exp(), ids)  # (b, 1)
        drawn = self._draw(p, idx)  # (B, 1)
        if bool(spill.any()):
            drawn[rows] = draw_full
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn, 0.0)

    def _draw(self, p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(b, n) probabilities in descending order and their token ids -> (b, 1) a draw from the
        nucleus: top-p keeps a token while the mass ranked above it is below top_p."""
        keep = (p.cumsum(-1) - p) < self.top_p
        keep[:, 0] = True
        return ids.gather(1, torch.multinomial(p * keep, 1))


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
    if attention_mask is None:  # HF's "sdpa" masks (registered below): bool, or None for "every position"
        mask = torch.ones(B, 1, S, dtype=torch.bool, device=query.device)  # (B, 1, S)
    else:
        mask = attention_mask[:, 0]  # (B, 1, S)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = attention(query, key, value, mask, scale, "manual", kwargs.get("softcap"))  # (B, H, 1, hd)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make NAME a valid `attn_implementation` (its masks are HF's "sdpa" masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """Run `model` with attention `name` (NAME or one of HF's), then give it back as it was."""
    before = model.config._attn_implementation
    if name == NAME:
        register()
    if name != before:
        model.set_attn_implementation(name)
    try:
        yield
    finally:
        if name != before:
            model.set_attn_implementation(before)
