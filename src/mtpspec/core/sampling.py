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
        x = x.masked_fill(top_p_drop(x, cfg.top_p), float("-inf"))
    return x.softmax(-1)


def top_p_drop(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """(N, V) -> (N, V) bool: the tokens HF's TopPLogitsWarper drops, the tail whose cumulative
    mass (from the least likely up) is <= 1 - top_p, always keeping the most likely token; with
    torch's own (unstable) order among tokens tied at the cut.

    torch sorts the whole row for this (~2.7 ms for 49,152 tokens on 2 cores, most of a sampled
    row's cost outside the forward). Here the sorted values come from numpy's sort (the values
    do not depend on how ties are ordered, so neither do the softmax, the cumsum and the number
    of tokens dropped), and `nucleus.c` finds which tokens torch's sort would put in those
    places by running its partitions on the side of the cut only (~0.3 ms in all). Anything that
    path does not read the same way (not a CPU float32 matrix, a NaN or +inf, no C compiler, a
    torch whose sort the first call finds to order ties otherwise) goes through torch's sort."""
    so = _nucleus() if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 else None
    got = _top_p_drop_native(x.contiguous(), top_p, so) if so is not None and x.shape[-1] > 0 and not x.requires_grad else None
    return got if got is not None else _top_p_drop_torch(x, top_p)


def _top_p_drop_torch(x: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_x, idx = torch.sort(x, dim=-1, descending=False)
    drop_sorted = _sorted_drop(sorted_x, top_p)
    return drop_sorted.scatter(-1, idx, drop_sorted)


def _sorted_drop(sorted_x: torch.Tensor, top_p: float) -> torch.Tensor:
    """(N, V) ascending values -> (N, V) bool: the sorted positions the cut drops."""
    drop_sorted = sorted_x.softmax(-1).cumsum(-1) <= (1.0 - top_p)
    drop_sorted[..., -1] = False
    return drop_sorted


def _top_p_drop_native(x: torch.Tensor, top_p: float, so: ctypes.CDLL) -> torch.Tensor | None:
    """`top_p_drop` through nucleus.c (x contiguous); None where it cannot (a NaN or +inf)."""
    N, V = x.shape
    sorted_x = torch.from_numpy(np.sort(x.numpy(), axis=-1))  # (N, V): torch.sort's values
    if not bool((sorted_x[:, -1] < float("inf")).all()):  # numpy sorts NaN and +inf last
        return None
    drop_sorted = _sorted_drop(sorted_x, top_p)
    d = drop_sorted.sum(-1)  # (N,) sorted positions dropped: a prefix, the cumsum never falls
    if not torch.equal(drop_sorted, torch.arange(V)[None, :] < d[:, None]):
        return None
    drop = torch.empty(N, V, dtype=torch.uint8)
    if so.nucleus_drop(x.data_ptr(), N, V, d.data_ptr(), drop.data_ptr()) != 0:
        return None
    return drop.bool()


@functools.cache
def _nucleus_built() -> ctypes.CDLL | None:
    """nucleus.c compiled and loaded (None: disabled, no compiler, not x86-64), not yet checked."""
    if os.environ.get("MTPSPEC_NATIVE", "1") == "0":
        return None
    so, _ = native.build(Path(__file__).with_name("nucleus.c"), ("-O3", "-fopenmp", "-shared", "-fPIC"), set())
    if so is not None:
        so.nucleus_drop.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        so.nucleus_drop.restype = ctypes.c_int
    return so


@functools.cache
def _nucleus() -> ctypes.CDLL | None:
    """nucleus.c, built and checked once: on rows with many tied values and several top_p, it
    must drop exactly the tokens torch's sort drops, or torch's sort is used from then on."""
    so = _nucleus_built()
    if so is None:
        return None
    g = torch.Generator().manual_seed(0)
    rows = (torch.randn(4, 4099, generator=g) * torch.tensor([[0.5], [2.0], [4.0], [8.0]])).bfloat16().float()
    for top_p in (0.3, 0.8, 0.95):
        got = _top_p_drop_native(rows, top_p, so)
        if got is None or not torch.equal(got, _top_p_drop_torch(rows, top_p)):
            return None
    return so


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
