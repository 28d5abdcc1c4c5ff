"""Turning logits into the distribution a token is drawn from, as Hugging Face `generate`
does: temperature, then top-k, then top-p. The same function is applied to the target's p and
to the draft's q, so that speculative sampling compares like with like.

V vocabulary, N rows (positions)."""

from __future__ import annotations

import torch

from ..config import SamplingConfig


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """(N, V) logits -> (N, V) float32 probabilities after temperature, top-k and top-p.
    Only for sampling (cfg.temperature > 0); greedy decoding never builds a distribution."""
    x = logits.float() / cfg.temperature  # (N, V)
    V = x.shape[-1]
    if 0 < cfg.top_k < V:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]  # (N, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        # Drop the tail whose cumulative mass (from the least likely up) is <= 1 - top_p,
        # always keeping the most likely token: HF's TopPLogitsWarper.
        sorted_x, idx = torch.sort(x, dim=-1, descending=False)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop_sorted = cum <= (1.0 - cfg.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, idx, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(N, V) -> (N,) one draw per row."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def make_generator(cfg: SamplingConfig, device: torch.device | str = "cpu") -> torch.Generator | None:
    """An explicit generator: no global RNG state is read or written."""
    if cfg.greedy:
        return None
    g = torch.Generator(device=device)
    if cfg.seed is None:
        g.seed()
    else:
        g.manual_seed(cfg.seed)
    return g
