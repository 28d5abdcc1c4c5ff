"""The target's whole bf16 forward as one C call (`fused.c`), for Llama-style models on x86-64
CPUs with AVX-512 BF16 (Sapphire Rapids and later Xeons, Zen 4 and later EPYCs).

Letters: T new tokens, D hidden size, V vocabulary, N layers, S cache slots, hd head dim.

Why: a one-token forward of SmolLM2-135M through torch issues ~450 small ops; on a 2-core
Xeon they cost ~11-15 ms of a ~30 ms forward (the bf16 matmuls ~15 ms), and no kernel choice
removes that. Here one call runs every layer: the weights stream once for all rows
(`_mm512_dpbf16_ps`), attention reads the target's own cache in place, and nothing returns to
Python until the logits. Every row is computed independently of the others (see fused.c), so
the verify pass of k + 1 rows equals k + 1 one-row passes bit for bit, and a draft tree's row
attends its ancestors where they lie, with no copies of the cache.

It reads the model's weights by reference, as `Target` does (the stacked q/k/v and gate/up
views, the norms, the tied LM head), and writes the same `KVCache` layout, so the head
cross-attends it unchanged. What it computes is the bf16 model as torch rounds it, up to the
order of fp32 sums; plain decoding and speculative decoding both run it, so the guarantee
(speculative greedy == plain greedy, token for token) is unchanged.

Used where `unsupported(target)` returns None; `MTPSPEC_FUSED=0` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from . import native

if TYPE_CHECKING:
    from .target import KVCache, Target, TargetStep

SOURCE = Path(__file__).with_name("fused.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-mfma",
         "-fopenmp", "-shared", "-fPIC")
CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma"}
# Pre-norm families with Llama's RMSNorm, SiLU MLP and rotated halves, nothing else between
# the matmuls: exactly what fused.c computes.
FAMILIES = ("llama", "qwen2", "mistral", "phi3", "smollm3")
_P = ctypes.c_void_p


class _Model(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("n_layers", "D", "H", "Hk", "hd", "M", "V", "S")] + [
        (n, ctypes.POINTER(_P)) for n in ("attn_norm", "mlp_norm", "wqkv", "bqkv", "wo", "bo", "wgu", "bgu", "wdown", "bdown")
    ] + [(n, ctypes.POINTER(ctypes.c_float)) for n in ("attn_eps", "mlp_eps", "scale")] + [
        ("rope", ctypes.POINTER(ctypes.c_int)), ("window", ctypes.POINTER(ctypes.c_int)),
        ("final_norm", _P), ("final_eps", ctypes.c_float), ("lm_w", _P), ("lm_b", _P), ("keys", _P), ("values", _P),
    ]


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, bool, str | None]:
    """(the library, whether its matmuls run on AMX, None), or (None, False, why not)."""
    if os.environ.get("MTPSPEC_FUSED", "1") == "0":
        return None, False, "disabled by MTPSPEC_FUSED=0"
    so, why = native.build(SOURCE, FLAGS, CPU_FLAGS)
    if so is None:
        return None, False, why
    so.fused_forward.argtypes = [ctypes.POINTER(_Model), _P, ctypes.c_int, ctypes.c_int, _P, _P, _P, _P, _P,
                                 ctypes.c_int, _P, _P, ctypes.c_int, _P, ctypes.c_int]
    so.fused_forward.restype = None
    so.fused_matmul.argtypes = [_P, ctypes.c_int, ctypes.c_int, _P, ctypes.c_int, _P, ctypes.c_int]
    so.fused_matmul.restype = None
    # AMX where the CPU has it (and MTPSPEC_AMX is not 0): once per process, so every forward
    # of the process runs the same matmul kernel
    want_amx = {"amx_tile", "amx_bf16"} <= set(native.cpuinfo("flags").split()) and os.environ.get("MTPSPEC_AMX", "1") != "0"
    so.fused_init.argtypes = [ctypes.c_int]
    so.fused_init.restype = ctypes.c_int
    return so, bool(so.fused_init(int(want_amx))), None


def _loaded() -> tuple[ctypes.CDLL | None, str | None]:
    so, _, why = _library()
    return so, why


def uses_amx() -> bool:
    """Whether the fused matmuls run on AMX tiles here (else AVX-512 BF16 dot products)."""
    return _library()[1]


def reason() -> str | None:
    """Why the fused forward cannot run on this machine at all, or None if it can."""
    return _loaded()[1]


def unsupported(target: Target) -> str | None:
    """Why `target` cannot run through the fused forward, or None if it can."""
    if (why := reason()) is not None:
        return why
    if target.dtype != torch.bfloat16 or target.device.type != "cpu":
        return f"the fused forward runs bf16 on the CPU; the target is {target.dtype} on {target.device}"
    if target.model_type not in FAMILIES:
        return f"the fused forward covers {', '.join(FAMILIES)}, not {target.model_type}"
    cfg = target.config
    if getattr(cfg, "hidden_act", "silu") != "silu" or target.interleaved_rope or target.residual_multiplier != 1.0 \
            or target.attn_softcap is not None or target.head_dim % 2 or target.head_dim > 256:
        return "the fused forward needs SiLU, half-rotated RoPE, no residual multiplier or attention soft-cap, head dim <= 256"
    for L in target._layers:
        if not is_silu(L.act):
            return f"the fused forward computes SiLU MLPs; a layer uses {type(L.act).__name__}"
        if L.attn_out is not None or L.mlp_out is not None or L.q_norm is not None or L.rope not in ("", None):
            return "the fused forward needs pre-norm layers without q/k norms and one RoPE table"
    return None


def _ptrs(ts: list[torch.Tensor | None]) -> ctypes.Array:
    return (_P * len(ts))(*[None if t is None else t.data_ptr() for t in ts])


class FusedForward:
    """`Target.forward` for one target, as one C call; holds the pointer tables (built once per
    set of weights: `Target` rebuilds it when its layers are read again)."""

    def __init__(self, target: Target):
        self.target = target
        mods = target.model.model
        layers = list(mods.layers)
        self._keep: list[object] = []  # every tensor and array the C struct points into

        self._read: list[tuple[torch.Tensor, int]] = []  # (parameter, the data_ptr read): see `current`

        def w(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            self._read.append((t, t.data_ptr()))
            t = t.detach()  # holds the storage: a parameter given new data never frees what C reads
            if not t.is_contiguous():
                raise ValueError("the fused forward reads weights in place; a weight is not contiguous")
            self._keep.append(t)
            return t

        Ls = target._layers
        tabs = {
            "attn_norm": [w(lay.input_layernorm.weight) for lay in layers],
            "mlp_norm": [w(lay.post_attention_layernorm.weight) for lay in layers],
            "wqkv": [w(L.qkv[0]) for L in Ls], "bqkv": [w(L.qkv[1]) for L in Ls],
            "wo": [w(L.o[0]) for L in Ls], "bo": [w(L.o[1]) for L in Ls],
            "wgu": [w(L.gate_up[0]) for L in Ls], "bgu": [w(L.gate_up[1]) for L in Ls],
            "wdown": [w(L.down[0]) for L in Ls], "bdown": [w(L.down[1]) for L in Ls],
        }
        from .target import _eps

        floats = {
            "attn_eps": [_eps(lay.input_layernorm) for lay in layers],
            "mlp_eps": [_eps(lay.post_attention_layernorm) for lay in layers],
            "scale": [L.scale for L in Ls],
        }
        ints = {"rope": [int(L.rope is not None) for L in Ls], "window": [int(wd or 0) for wd in target.windows]}
        m = _Model(n_layers=len(Ls), D=target.hidden_size, H=target.num_heads, Hk=target.num_kv_heads,
                   hd=target.head_dim, M=int(Ls[0].gate_up[0].shape[0]) // 2, V=target.vocab_size, S=0)
        for name, ts in tabs.items():
            arr = _ptrs(ts)
            self._keep.append(arr)
            setattr(m, name, ctypes.cast(arr, ctypes.POINTER(_P)))
        for name, vals in floats.items():
            arr = (ctypes.c_float * len(vals))(*vals)
            self._keep.append(arr)
            setattr(m, name, ctypes.cast(arr, ctypes.POINTER(ctypes.c_float)))
        for name, vals in ints.items():
            arr = (ctypes.c_int * len(vals))(*vals)
            self._keep.append(arr)
            setattr(m, name, ctypes.cast(arr, ctypes.POINTER(ctypes.c_int)))
        m.final_norm = w(mods.norm.weight).data_ptr()
        m.final_eps = _eps(mods.norm)
        m.lm_w = w(target.lm_head.weight).data_ptr()
        lm_b = w(target.lm_head.bias)
        m.lm_b = None if lm_b is None else lm_b.data_ptr()
        self.model = m

    def current(self) -> bool:
        """False once any weight read here was given new data (`param.data = ...`, a cast)."""
        return all(p.data_ptr() == ptr for p, ptr in self._read)

    def __call__(self, input_ids: torch.Tensor, cache: KVCache, hidden_layers: tuple[int, ...],
                 positions: torch.Tensor | None, tree_mask: torch.Tensor | None, logits_to_keep: int) -> TargetStep:
        from .target import TargetStep, signed_sin

        so = _loaded()[0]
        assert so is not None
        tgt = self.target
        T = int(input_ids.shape[1])
        start = cache.length
        cache.reserve(start + T)
        if cache._planes is not None or not (cache.keys.is_contiguous() and cache.values.is_contiguous()):
            raise ValueError("the fused forward writes a plain contiguous cache (no tree planes)")
        if positions is None:
            positions = torch.arange(start, start + T)
        x = tgt.embed_tokens(input_ids)[0].to(torch.bfloat16).contiguous().clone()  # (T, D): written in place
        cos, sin = tgt._rope_table("", x, positions[None])  # (1, T, hd) each
        cos = cos[0].to(torch.bfloat16).contiguous()
        sin = signed_sin(sin[0]).to(torch.bfloat16).contiguous()
        pos = positions.to(torch.int32).contiguous()
        nanc = anc = None
        if tree_mask is not None and not bool((tree_mask == torch.ones_like(tree_mask).tril()).all()):
            nanc = tree_mask.sum(-1).to(torch.int32).contiguous()  # (T,): ancestors + self
            order = torch.arange(T).expand(T, T)
            # each row's attended new rows first, in ascending (= depth) order: (T, T)
            anc = torch.where(tree_mask, order, T).sort(-1).values.to(torch.int32).contiguous()
        n_feat = tgt.num_layers + 1
        want = sorted({i % n_feat for i in hidden_layers})
        fl = torch.tensor(want, dtype=torch.int32)
        feats = x.new_empty(len(want), T, x.shape[1])  # (nf, T, D)
        Tk = logits_to_keep or T
        logits = torch.empty(Tk, tgt.vocab_size, dtype=torch.float32)  # (Tk, V)
        m = self.model
        m.S, m.keys, m.values = cache.capacity, cache.keys.data_ptr(), cache.values.data_ptr()
        so.fused_forward(ctypes.byref(m), x.data_ptr(), T, start, pos.data_ptr(),
                         None if nanc is None else nanc.data_ptr(), None if anc is None else anc.data_ptr(),
                         cos.data_ptr(), sin.data_ptr(), len(want), fl.data_ptr(), feats.data_ptr(),
                         Tk, logits.data_ptr(), torch.get_num_threads())
        cache.length = start + T
        hidden = torch.cat([feats[want.index(i % n_feat)] for i in hidden_layers], -1)[None]  # (1, T, F)
        return TargetStep(logits=tgt.finish_logits(logits)[None], hidden=hidden)


def is_silu(act: nn.Module) -> bool:
    """SiLU as torch or transformers names its module."""
    return type(act).__name__ in ("SiLU", "SiLUActivation")
