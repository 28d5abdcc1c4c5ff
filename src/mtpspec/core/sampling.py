"""Turning logits into the distribution a token is drawn from, as Hugging Face `generate`
does: temperature, then top-k, then top-p. The same function is applied to the target's p and
to the draft's q, so that speculative sampling compares like with like.

V vocabulary, N rows (positions)."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import torch

from ..config import SamplingConfig
from . import native


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
    return multinomial(probs, generator).squeeze(-1)


def multinomial(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`torch.multinomial(probs, 1, generator=generator)`, draw for draw, with the generator left
    in the same state: (V,) -> (1,), (N, V) -> (N, 1).

    On the CPU torch draws an Exp(1) variate for every token and takes argmax(p / q): ~1 ms for
    SmolLM2's 49,152 tokens, most of a sampled row's cost outside the forward. `twister.c` runs
    the generator's Mersenne Twister over every token as torch does but turns into variates only
    the tokens with p > 0, the only ones that can win (~0.3 ms with 6,700 such tokens). Anything it does not read the
    same way (a CUDA tensor or generator, another dtype, a non-contiguous tensor, the global
    generator, no C compiler, p negative, not finite or without mass, a zero variate) is drawn by
    torch itself."""
    fast = (generator is not None and generator.device.type == "cpu" and probs.device.type == "cpu"
            and probs.dtype == torch.float32 and probs.dim() in (1, 2) and probs.shape[-1] > 0
            and probs.is_contiguous())  # torch draws in memory order
    got = _multinomial_native(probs, generator) if fast else None  # type: ignore[arg-type]
    return got if got is not None else torch.multinomial(probs, 1, generator=generator)


_MT_N = 624  # the twister's state words
_STATE_LEFT, _STATE_NEXT, _STATE_WORDS = 8, 16, 24  # byte offsets in torch's CPU generator state


@functools.cache
def _twister() -> ctypes.CDLL | None:
    if os.environ.get("MTPSPEC_NATIVE", "1") == "0":
        return None
    so, _ = native.build(Path(__file__).with_name("twister.c"), ("-O3", "-shared", "-fPIC"), set())
    if so is not None:
        so.mt_multinomial.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                      ctypes.c_void_p]
        so.mt_multinomial.restype = ctypes.c_int
    return so


def _multinomial_native(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor | None:
    so = _twister()
    if so is None:
        return None
    state = generator.get_state()  # uint8: torch's CPUGeneratorImplState
    raw = state.numpy()
    left = int(raw[_STATE_LEFT:_STATE_LEFT + 4].view(np.int32)[0])
    nxt = int(raw[_STATE_NEXT:_STATE_NEXT + 8].view(np.uint64)[0])
    if not (left == 1 and nxt in (0, _MT_N)) and left != _MT_N + 1 - nxt:
        return None  # a state this reading does not know
    words = raw[_STATE_WORDS:_STATE_WORDS + 8 * _MT_N].view(np.uint64)  # each 32-bit word kept in 64 bits
    s = words.astype(np.uint32)
    pos = np.array([_MT_N if left == 1 else nxt], dtype=np.int32)
    n, v = (1, probs.shape[0]) if probs.dim() == 1 else probs.shape
    picks = torch.empty(n, dtype=torch.long)
    if so.mt_multinomial(s.ctypes.data, pos.ctypes.data, probs.data_ptr(), n, v, picks.data_ptr()) != 0:
        return None
    words[:] = s
    raw[_STATE_LEFT:_STATE_LEFT + 4].view(np.int32)[0] = _MT_N + 1 - int(pos[0])
    raw[_STATE_NEXT:_STATE_NEXT + 8].view(np.uint64)[0] = int(pos[0])
    generator.set_state(state)
    return picks.reshape(*probs.shape[:-1], 1)


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
