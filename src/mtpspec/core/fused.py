"""The target's whole forward as one C call (`fused.c`), for Llama-style models on x86-64 CPUs
with AVX-512: bf16 where the CPU has AVX-512 BF16 (Sapphire Rapids and later Xeons, Zen 4 and
later EPYCs; AMX tiles where present), fp32 where it has AVX-512F (the same source built with
-DFUSED_F32).

Letters: T new tokens, D hidden size, V vocabulary, N layers, S cache slots, hd head dim.

Why: a one-token forward of SmolLM2-135M through torch issues ~450 small ops; on a 2-core
Xeon they cost ~11-15 ms of a ~30 ms forward (the bf16 matmuls ~15 ms), and no kernel choice
removes that. Here one call runs every layer: the weights stream once for all rows
(`_mm512_dpbf16_ps`), attention reads the target's own cache in place, and nothing returns to
Python until the logits (in fp32 the extra rows of a verify pass cost ~1.3-1.5x op by op, the
attention and elementwise steps between the matmuls; here they cost what their arithmetic does).
Every row is computed independently of the others (see fused.c), so
the verify pass of k + 1 rows equals k + 1 one-row passes bit for bit, and a draft tree's row
attends its ancestors where they lie, with no copies of the cache.

It reads the model's weights by reference through their public description
(`Target.weights()`, `weights.py`: the stacked q/k/v and gate/up views, the norms, the tied LM
head), and writes the same `KVCache` layout, so the head cross-attends it unchanged. A draft
tree comes as its `tree.TreeLayout`, each row's ancestors already listed in depth order. What
it computes is the model as torch rounds it in its dtype, up to the order of fp32 sums; plain
decoding and speculative decoding both run it, so the guarantee (speculative greedy == plain
greedy, token for token) is unchanged.

On a CPU with AMX, dense bf16 matrices run on its tiles; quantized ones (a GGUF file's blocks)
too where the process asks for it (`amx_blocks(True)` or MTPSPEC_AMX=blocks, as a batching
server does): many rows cost about one there, one row more than on AVX-512. MTPSPEC_AMX=0 keeps
everything on AVX-512. Each choice holds for the whole process, so every forward of it sums in
one order.

Used where `unsupported(target)` returns None; `MTPSPEC_FUSED=0` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import native, quant
from .rope import signed_sin
from .weights import Projection

if TYPE_CHECKING:
    from .head import MTPHead
    from .target import KVCache, Target
    from .tree import TreeLayout
    from .weights import Norm

SOURCE = Path(__file__).with_name("fused.c")
_COMMON = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
# per dtype: (compiler flags, the CPU flags they need)
BUILDS = {
    torch.bfloat16: (_COMMON + ("-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-bf16"),
                     {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "fma", "f16c"}),
    torch.float32: (_COMMON + ("-DFUSED_F32",), {"avx512f", "avx512bw", "avx512vl", "fma", "f16c"}),
}
# Pre-norm families with Llama's RMSNorm, SiLU MLP and rotated halves, nothing else between
# the matmuls: exactly what fused.c computes.
FAMILIES = ("llama", "qwen2", "mistral", "phi3", "smollm3")
_P = ctypes.c_void_p

# HF rotary types whose (cos, sin) depend on the positions alone (not on the longest seen), so
# that `FusedForward._rope` may keep them; and how many runs of positions it keeps.
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
ROPE_CACHE = 4096


class _Model(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("n_layers", "D", "H", "Hk", "hd", "M", "V")] + [
        (n, ctypes.POINTER(_P)) for n in ("attn_norm", "mlp_norm", "bqkv", "bo", "bgu", "bdown")
    ] + [(n, ctypes.POINTER(quant.Mat)) for n in ("wqkv", "wo", "wgu", "wdown")] + [
        (n, ctypes.POINTER(ctypes.c_float)) for n in ("attn_eps", "mlp_eps", "scale")] + [
        ("rope", ctypes.POINTER(ctypes.c_int)), ("window", ctypes.POINTER(ctypes.c_int)),
        ("final_norm", _P), ("final_eps", ctypes.c_float), ("lm_w", quant.Mat), ("lm_b", _P),
    ]


class _Seq(ctypes.Structure):
    """One sequence's share of a batched call (fused.c's Seq): its rows, its cache, its tree."""
    _fields_ = [(n, ctypes.c_int) for n in ("row0", "T", "start", "S")] + [
        (n, _P) for n in ("keys", "values", "nanc", "anc")]


class _Head(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("D", "H", "Hk", "hd", "M", "n_blocks")] + [
        ("eps", ctypes.c_float), ("final_eps", ctypes.c_float)] + [
        (n, _P) for n in ("norm_state", "norm_embed", "fc", "final_norm")] + [
        (n, ctypes.POINTER(_P)) for n in ("norm_attn", "wq", "wo", "norm_mlp", "wgu", "wdown")] + [
        (n, ctypes.POINTER(quant.Mat)) for n in ("qfc", "qwq", "qwo", "qwgu", "qwdown")]


AMX_DENSE, AMX_BLOCKS = 1, 2  # fused.c's fused_init bits: dense matrices on the AMX tiles; quantized ones too


@functools.cache
def _library(dtype: torch.dtype = torch.bfloat16) -> tuple[ctypes.CDLL | None, int, str | None]:
    """(the library for `dtype`, the AMX bits its matmuls start with, None), or (None, 0, why not)."""
    if os.environ.get("MTPSPEC_FUSED", "1") == "0":
        return None, 0, "disabled by MTPSPEC_FUSED=0"
    if dtype not in BUILDS:
        return None, 0, f"the fused forward runs bf16 or fp32, not {dtype}"
    so, why = native.build(SOURCE, *BUILDS[dtype])
    if so is None:
        return None, 0, why
    so.fused_forward_seqs.argtypes = [ctypes.POINTER(_Model), ctypes.c_int, ctypes.POINTER(_Seq), _P, ctypes.c_int, _P,
                                      _P, _P, ctypes.c_int, _P, _P, ctypes.c_int, _P, _P, _P, ctypes.c_int]
    so.fused_forward_seqs.restype = None
    so.fused_matmul.argtypes = [_P, ctypes.c_int, ctypes.c_int, _P, ctypes.c_int, _P, ctypes.c_int]
    so.fused_matmul.restype = None
    so.fused_qmatmul.argtypes = [_P, ctypes.c_int, ctypes.c_int, _P, ctypes.c_int, _P, ctypes.c_int]
    so.fused_qmatmul.restype = None
    so.fused_rows.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, _P]
    so.fused_rows.restype = None
    so.head_step_seqs.argtypes = [ctypes.POINTER(_Head), ctypes.c_int, ctypes.POINTER(_Seq), ctypes.c_int] + [_P] * 5 + [
        ctypes.c_int, _P, _P, ctypes.c_int, _P, _P, ctypes.c_int]
    so.head_step_seqs.restype = None
    so.head_chain_seqs.argtypes = [ctypes.POINTER(_Head), ctypes.c_int, ctypes.POINTER(_Seq)] + [_P] * 5 + [
        _P, ctypes.c_int] + [_P] * 5 + [ctypes.c_int, ctypes.c_int]
    so.head_chain_seqs.restype = ctypes.c_int
    if dtype == torch.bfloat16:
        so.fused_pack.argtypes = [_P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long, _P]
        so.fused_pack.restype = None
    # AMX where the CPU has it (MTPSPEC_AMX: 0 off, 1 (default) dense matrices, blocks quantized
    # ones too): once per process, so every forward of the process runs the same matmul kernels
    want = {"0": 0, "blocks": AMX_DENSE | AMX_BLOCKS}.get(os.environ.get("MTPSPEC_AMX", "1"), AMX_DENSE)
    if dtype != torch.bfloat16 or not {"amx_tile", "amx_bf16"} <= set(native.cpuinfo("flags").split()):
        want = 0
    so.fused_init.argtypes = [ctypes.c_int]
    so.fused_init.restype = ctypes.c_int
    so.fused_amx.argtypes = []
    so.fused_amx.restype = ctypes.c_int
    return so, so.fused_init(want), None


def _loaded(dtype: torch.dtype = torch.bfloat16) -> tuple[ctypes.CDLL | None, str | None]:
    so, _, why = _library(dtype)
    return so, why


def uses_amx() -> bool:
    """Whether this machine runs the fused bf16 matmuls on AMX tiles (else AVX-512 BF16 dot
    products), as the process started (MTPSPEC_AMX)."""
    return bool(_library(torch.bfloat16)[1])


def matmuls(target: Target) -> str:
    """How this process computes `target`'s matrices now, as a data set records it: "amx" (dense
    and quantized matrices on AMX tiles), "amx-dense" (dense ones only, quantized ones on
    AVX-512), "avx512" (AVX-512 dot products; on a CPU with AMX too under MTPSPEC_AMX=0), or
    "torch" (the target does not run through the fused forward here). Each is exact in itself, but
    their fp32 sums run in different orders, so a sampled token can come out differently."""
    if unsupported(target) is not None:
        return "torch"
    so = _library(target.dtype)[0]
    bits = so.fused_amx() if so is not None and target.dtype == torch.bfloat16 else 0
    return "amx" if bits & AMX_BLOCKS else "amx-dense" if bits else "avx512"


def amx_blocks(on: bool) -> bool:
    """Run quantized matrices (GGUF blocks) on the AMX tiles too, or not; returns whether they now
    do (False where there is no AMX). For a process that batches many rows per forward (a server,
    the data writer): up to 16 rows cost about one there, but one row costs more than on AVX-512
    dot products (reports/batching/). Every output stays exact for the process (speculative ==
    plain, per request), but differs in the order of fp32 sums from a process without it: call
    it once, before the first forward."""
    so, start, _ = _library(torch.bfloat16)
    if so is None or not start:
        return False
    return bool(so.fused_init(AMX_DENSE | AMX_BLOCKS if on else AMX_DENSE) & AMX_BLOCKS)


@contextlib.contextmanager
def blocks_on_amx(on: bool = True) -> Iterator[bool]:
    """`amx_blocks(on)` for the body (a job that batches, run from a longer process), set back
    to what it was after; yields whether blocks run on AMX in the body."""
    so = _library(torch.bfloat16)[0]
    if so is None:
        yield False
        return
    before = so.fused_amx()
    try:
        yield amx_blocks(on) if before else False
    finally:
        so.fused_init(before)


def reason(dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why the fused forward cannot run in `dtype` on this machine at all, or None if it can."""
    return _loaded(dtype)[1]


def unsupported(target: Target) -> str | None:
    """Why `target` cannot run through the fused forward, or None if it can."""
    if target.device.type != "cpu":
        return f"the fused forward runs on the CPU; the target is on {target.device}"
    if (why := reason(target.dtype)) is not None:
        return why
    if target.model_type not in FAMILIES:
        return f"the fused forward covers {', '.join(FAMILIES)}, not {target.model_type}"
    cfg = target.config
    if getattr(cfg, "hidden_act", "silu") != "silu" or target.interleaved_rope or target.residual_multiplier != 1.0 \
            or target.attn_softcap is not None or target.head_dim % 2 or target.head_dim > 256:
        return "the fused forward needs SiLU, half-rotated RoPE, no residual multiplier or attention soft-cap, head dim <= 256"
    weights = target.weights()
    if not weights.llama_norms:
        return "the fused forward computes Llama's RMSNorm"
    for L in weights.layers:
        if L.activation != "silu":
            return f"the fused forward computes SiLU MLPs; a layer uses {L.activation}"
        if L.attn_norm is None or L.mlp_norm is None or L.attn_out_norm is not None or L.mlp_out_norm is not None \
                or L.q_norm is not None or L.rope not in ("", None):
            return "the fused forward needs pre-norm layers without q/k norms and one RoPE table"
    return None


class _Pointers:
    """Pointers into a model's weights for a C struct, with what keeps them valid: each tensor's
    storage is held (a parameter given new data never frees what C reads), and `current` says
    whether every parameter still holds the data that was read."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.read: list[tuple[torch.Tensor, int]] = []  # (parameter, the data_ptr read)
        self.keep: list[object] = []  # tensors and ctypes arrays the struct points into

    def ptr(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        if t.dtype != self.dtype or not t.is_contiguous():
            raise ValueError(f"the fused kernels read contiguous {self.dtype} weights in place; got {t.dtype}")
        self.read.append((t, t.data_ptr()))
        self.keep.append(t.detach())
        return t.data_ptr()

    def table(self, ts: list[torch.Tensor | None]) -> ctypes._Pointer:
        arr = (_P * len(ts))(*[self.ptr(t) for t in ts])
        self.keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(_P))

    def mat(self, p: Projection) -> quant.Mat:
        """One matrix as fused.c reads it: its dense or quantized parts, stacked."""
        parts = p.matrices
        for m in parts:
            if isinstance(m, quant.QTensor):
                self.keep.append(m.data)  # quantized blocks never change in place
            else:
                self.ptr(m)  # checks the dtype and layout; held and watched like every dense weight
        return quant.mat(parts, self.dtype)

    def projections(self, ps: list[Projection]) -> tuple[ctypes._Pointer, ctypes._Pointer]:
        """(matrices, biases): one table each, a layer per entry (a null bias: none)."""
        return self.array(quant.Mat, [self.mat(p) for p in ps]), self.table([p.bias for p in ps])

    def norms(self, ns: list[Norm]) -> tuple[ctypes._Pointer, ctypes._Pointer]:
        """(weights, epsilons): a layer per entry."""
        return self.table([n.weight for n in ns]), self.array(ctypes.c_float, [n.eps for n in ns])

    def array(self, ctype: type, vals: list) -> ctypes._Pointer:
        arr = (ctype * len(vals))(*vals)
        self.keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(ctype))

    def current(self) -> bool:
        return all(p.data_ptr() == ptr for p, ptr in self.read)


class FusedForward:
    """`Target.forward` for one target, as one C call; holds the pointer tables (built once per
    set of weights: `Target` rebuilds it when its layers are read again)."""

    def __init__(self, target: Target):
        self.target = target
        self._rope_cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (first position, T) -> tables
        weights = target.weights()
        Ls = list(weights.layers)  # pre-norm layers (`unsupported`): attn_norm and mlp_norm are set
        self.pointers = W = _Pointers(target.dtype)
        m = _Model(n_layers=len(Ls), D=target.hidden_size, H=target.num_heads, Hk=target.num_kv_heads,
                   hd=target.head_dim, M=Ls[0].gate_up.out_features // 2, V=target.vocab_size)
        m.attn_norm, m.attn_eps = W.norms([L.attn_norm for L in Ls])  # type: ignore[misc]
        m.mlp_norm, m.mlp_eps = W.norms([L.mlp_norm for L in Ls])  # type: ignore[misc]
        m.wqkv, m.bqkv = W.projections([L.qkv for L in Ls])
        m.wo, m.bo = W.projections([L.o for L in Ls])
        m.wgu, m.bgu = W.projections([L.gate_up for L in Ls])
        m.wdown, m.bdown = W.projections([L.down for L in Ls])
        m.scale = W.array(ctypes.c_float, [L.scale for L in Ls])
        m.rope = W.array(ctypes.c_int, [int(L.has_rope) for L in Ls])
        m.window = W.array(ctypes.c_int, [L.window or 0 for L in Ls])
        m.final_norm, m.final_eps = W.ptr(weights.final_norm.weight), weights.final_norm.eps
        m.lm_w, m.lm_b = W.mat(weights.lm_head), W.ptr(weights.lm_head.bias)
        self.model = m

    def current(self) -> bool:
        """False once any weight read here was given new data (`param.data = ...`, a cast)."""
        return self.pointers.current()

    def _rope(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) at (T,) positions, (T, hd) each in the compute dtype: HF's rotary table
        for exactly these positions, as computed alone. Kept per run of positions (a decoding
        sequence asks the same few again and again: SmolLM2's rotary call costs ~40 us) where
        the table depends on the positions only (`STATIC_ROPE`; a dynamic one rescales with the
        length seen)."""
        tgt, dt = self.target, self.target.dtype
        T = int(positions.shape[0])
        static = getattr(tgt.rotary_emb, "rope_type", None) in STATIC_ROPE
        key = (int(positions[0]), T) if static and T and int(positions[-1]) - int(positions[0]) == T - 1 else None
        if key is not None and (hit := self._rope_cache.get(key)) is not None:
            return hit
        cos, sin = tgt.rope_table(positions[None], x)  # (1, T, hd) each
        got = cos[0].to(dt), signed_sin(sin[0]).to(dt)
        if key is not None:
            if len(self._rope_cache) >= ROPE_CACHE:
                self._rope_cache.clear()
            self._rope_cache[key] = got
        return got

    def many(self, seqs: list[SeqRows], hidden_layers: tuple[int, ...]
             ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """The rows of several sequences in one forward (`Target.forward_many`), each over its own
        cache: per sequence (logits (1, Tk, V) float32, hidden (1, T, F), each logits row's argmax
        (Tk,) or None), what it would get alone."""
        tgt = self.target
        so = _loaded(tgt.dtype)[0]
        assert so is not None
        dt = tgt.dtype
        for sq in seqs:
            c = sq.cache
            if c.has_planes or not (c.keys.is_contiguous() and c.values.is_contiguous()):
                raise ValueError("the fused forward writes a plain contiguous cache (no tree planes)")
        Ts = [int(sq.input_ids.shape[1]) for sq in seqs]
        T = sum(Ts)
        ids = torch.cat([sq.input_ids for sq in seqs], 1)  # (1, T)
        x = tgt.embed_tokens(ids)[0].to(dt).contiguous()  # (T, D): a fresh tensor, written in place
        tables = [self._rope(sq.positions, x) for sq in seqs]  # each sequence's table as it would be computed alone
        cos, sin = torch.cat([c for c, _ in tables]).contiguous(), torch.cat([s for _, s in tables]).contiguous()  # (T, hd) each
        pos = torch.cat([sq.positions for sq in seqs]).to(torch.int32).contiguous()
        structs, log_rows, row0 = (_Seq * len(seqs))(), [], 0
        for i, (sq, Ts_i) in enumerate(zip(seqs, Ts)):
            # a tree: each row's ancestors and itself, (T_s,) counts and (T_s, T_s) rows in depth order
            nanc, anc = (None, None) if sq.layout is None else (sq.layout.nanc, sq.layout.anc)
            c = sq.cache
            structs[i] = _Seq(row0=row0, T=Ts_i, start=c.length, S=c.capacity, keys=c.keys.data_ptr(),
                              values=c.values.data_ptr(), nanc=None if nanc is None else nanc.data_ptr(),
                              anc=None if anc is None else anc.data_ptr())
            Tk = sq.logits_to_keep or Ts_i
            log_rows += range(row0 + Ts_i - Tk, row0 + Ts_i)
            row0 += Ts_i
        n_feat = tgt.num_layers + 1
        want = sorted({i % n_feat for i in hidden_layers})
        fl = torch.tensor(want, dtype=torch.int32)
        feats = x.new_empty(len(want), T, x.shape[1])  # (nf, T, D)
        rows = torch.tensor(log_rows, dtype=torch.int32)
        logits = torch.empty(len(log_rows), tgt.vocab_size, dtype=torch.float32)  # (sum Tk, V)
        # each row's argmax, found while the logits are finished (where nothing changes them after)
        choice = torch.empty(len(log_rows), dtype=torch.int32) if tgt.finish_logits_is_identity else None
        so.fused_forward_seqs(ctypes.byref(self.model), len(seqs), structs, x.data_ptr(), T, pos.data_ptr(),
                              cos.data_ptr(), sin.data_ptr(), len(want), fl.data_ptr(), feats.data_ptr(),
                              len(log_rows), rows.data_ptr(), logits.data_ptr(),
                              None if choice is None else choice.data_ptr(), torch.get_num_threads())
        logits = tgt.finish_logits(logits)
        if choice is not None:
            choice = None if bool((choice < 0).any()) else choice.long()  # a NaN: torch's argmax decides
        out, row0, l0 = [], 0, 0
        for sq, Ts_i in zip(seqs, Ts):
            sq.cache.length += Ts_i
            Tk = sq.logits_to_keep or Ts_i
            hidden = torch.cat([feats[want.index(i % n_feat), row0:row0 + Ts_i] for i in hidden_layers], -1)[None]  # (1, T_s, F)
            out.append((logits[l0:l0 + Tk][None], hidden, None if choice is None else choice[l0:l0 + Tk]))
            row0, l0 = row0 + Ts_i, l0 + Tk
        return out


@dataclass(frozen=True)
class SeqRows:
    """One sequence's rows in a forward: (1, T) ids appended to `cache` at (T,) positions; a tree's
    layout (None: a chain); logits for the last `logits_to_keep` rows (0: all)."""

    input_ids: torch.Tensor
    cache: KVCache
    positions: torch.Tensor | None = None
    layout: TreeLayout | None = None
    logits_to_keep: int = 0


def head_unsupported(head: MTPHead) -> str | None:
    """Why `head` cannot draft through the fused head step, or None if it can."""
    if head.target.engine != "fused":
        return f"its target runs op by op ({head.target.engine_reason()})"
    blocks = list(head.blocks)
    if head.fc.weight.dtype != head.target.dtype or head.fc.weight.device.type != "cpu":
        return f"the fused head step runs a head in its target's dtype ({head.target.dtype}) on the CPU"
    if len({b.mlp_hidden for b in blocks}) > 1 or any(b.H != head.target.num_heads or b.hd != head.target.head_dim for b in blocks):
        return "the fused head step needs blocks of one shape with the target's heads"
    return None


class FusedHead:
    """`MTPHead.step` + `project` for the rows of one draft depth as one C call (`head_step_seqs` in
    fused.c): the same computation, rounded as a torch run in the target's dtype rounds it, up
    to the order of fp32 sums."""

    def __init__(self, head: MTPHead):
        tgt = head.target
        final_norm = tgt.weights().final_norm
        blocks = list(head.blocks)
        self.head, self.pointers = head, (W := _Pointers(tgt.dtype))
        M = blocks[0].mlp_hidden if blocks else 0
        h = _Head(D=tgt.hidden_size, H=tgt.num_heads, Hk=tgt.num_kv_heads, hd=tgt.head_dim, M=M, n_blocks=len(blocks),
                  eps=head.norm_state.eps, final_eps=final_norm.eps)
        h.norm_state, h.norm_embed = W.ptr(head.norm_state.weight), W.ptr(head.norm_embed.weight)
        h.fc, h.final_norm = W.ptr(head.fc.weight), W.ptr(final_norm.weight)
        h.norm_attn = W.table([b.norm_attn.weight for b in blocks])
        h.wq, h.wo = W.table([b.q_proj.weight for b in blocks]), W.table([b.o_proj.weight for b in blocks])
        h.norm_mlp = W.table([b.norm_mlp.weight if M else None for b in blocks])
        h.wgu = W.table([b.gate_up.weight if M else None for b in blocks])
        h.wdown = W.table([b.down.weight if M else None for b in blocks])
        mats = {"qfc": [head.fc.weight], "qwq": [b.q_proj.weight for b in blocks], "qwo": [b.o_proj.weight for b in blocks]}
        if M:
            mats.update(qwgu=[b.gate_up.weight for b in blocks], qwdown=[b.down.weight for b in blocks])
        if tgt.dtype_name == "q8" and all(w.shape[1] % 32 == 0 for ws in mats.values() for w in ws):
            # the head's matrices as Q8_0 blocks too: half their bytes, multiplied as the target's are
            for name, ws in mats.items():
                setattr(h, name, W.array(quant.Mat, [self._q8(W, w) for w in ws]))
        # (V1, D): the head's draft-vocabulary rows, else the target's LM head (dense or quantized)
        lm = tgt.weights().lm_head
        if head.draft_weight is None:
            vocab = lm
        elif lm.quantized and len(lm.parts) == 1 and head.draft_ids is not None:
            # the draft vocabulary's rows of the LM head as the file stores them: the values of
            # `draft_weight` (those rows dequantized) at the blocks' bytes (Q8_0: half of bf16)
            q = lm.parts[0]
            ids = head.draft_ids.cpu()
            rows = q.take(ids)
            vocab = Projection(None, parts=(rows,))
        else:
            vocab = Projection(head.draft_weight)
        self.vocab, self.V1 = W.mat(vocab), vocab.out_features
        self.struct = h

    @staticmethod
    def _q8(W: _Pointers, w: torch.Tensor) -> quant.Mat:
        """A head matrix (read by `current` like every dense weight) as packed Q8_0 blocks."""
        W.read.append((w, w.data_ptr()))
        q = packed(quant.quantize_q8_0(w.detach()))
        W.keep.append(q.data)
        return quant.mat([q], W.dtype)

    def current(self) -> bool:
        return self.pointers.current()

    def step(self, state: torch.Tensor, tokens: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
             cache: KVCache, layer: int, extra: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, R, D) states, (1, R) tokens, all at one position with (hd,) rotary tables there ->
        the next states (1, R, D) and logits (R, V1 + E) over the draft vocabulary then `extra`
        (E, D) rows. R = 1 for a chain's step, a tree's frontier otherwise."""
        R = int(tokens.shape[1])
        out, (logits,) = self.step_many(state, tokens, cos.expand(R, -1), sin_signed.expand(R, -1), [cache], [R], layer, [extra])
        return out, logits

    def step_many(self, state: torch.Tensor, tokens: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
                  caches: list[KVCache], counts: list[int], layer: int,
                  extras: list[torch.Tensor | None] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One draft step for the rows of several sequences (continuous batching): (1, R, D)
        states, (1, R) tokens, (R, hd) rotary tables per row; the first counts[0] rows read
        caches[0] (at its length) and score extras[0] (E_0, D) after the draft vocabulary, the
        next counts[1] caches[1] and extras[1], ... Returns the next states (1, R, D) and, per
        sequence, its logits (counts[s], V1 + E_s): each row what it would be alone."""
        tgt = self.head.target
        dt = tgt.dtype
        so = _loaded(dt)[0]
        assert so is not None
        R = int(tokens.shape[1])
        state = state.to(dt).contiguous()
        emb = tgt.embed_tokens(tokens).to(dt).contiguous()  # (1, R, D)
        cos, sin_signed = cos.to(dt).contiguous(), sin_signed.to(dt).contiguous()
        extras = [None] * len(caches) if extras is None else [None if e is None else e.contiguous() for e in extras]
        Es = [0 if e is None else int(e.shape[0]) for e in extras]
        structs, row0 = (_Seq * len(caches))(), 0
        for i, (c, n) in enumerate(zip(caches, counts)):
            keys, values = c.keys[layer], c.values[layer]  # (Hk, S, hd): contiguous layers of the cache
            structs[i] = _Seq(row0=row0, T=n, start=c.length, S=c.capacity, keys=keys.data_ptr(), values=values.data_ptr())
            row0 += n
        if row0 != R or len(extras) != len(caches):
            raise ValueError(f"{R} rows for sequences of {counts} rows and {len(extras)} extras")
        V1, Emax = self.V1, max(Es, default=0)
        out = torch.empty_like(state)
        logits = torch.empty(R, V1 + Emax, dtype=torch.float32)
        w_extra = (_P * len(extras))(*[None if e is None else e.data_ptr() for e in extras])
        e_count = (ctypes.c_int * len(Es))(*Es)
        so.head_step_seqs(ctypes.byref(self.struct), len(caches), structs, R, state.data_ptr(), emb.data_ptr(),
                          cos.data_ptr(), sin_signed.data_ptr(), ctypes.addressof(self.vocab), V1, w_extra, e_count, Emax,
                          out.data_ptr(), logits.data_ptr(), torch.get_num_threads())
        per, row0 = [], 0
        for n, E in zip(counts, Es):
            per.append(tgt.finish_logits(logits[row0:row0 + n, :V1 + E].contiguous()))  # as alone: (n, V1 + E)
            row0 += n
        return out, per

    def chain_part(self) -> quant.Part | None:
        """The target's embedding as `head_chain_seqs` reads it (dense in the dtype, or blocks), or None
        where a draft step's embedding is more than a plain lookup (a multiplier, another module)."""
        tgt = self.head.target
        emb = tgt.embed
        if tgt.embedding_multiplier != 1.0 or not tgt.finish_logits_is_identity:
            return None
        q = getattr(emb, "qweight", None)  # a QuantEmbedding (qmodules.py): its blocks, looked up in `dtype`
        if isinstance(q, quant.QTensor) and getattr(emb, "dtype", None) == tgt.dtype:
            return quant.Part(q.data.data_ptr(), q.qtype, q.shape[0], q.row_bytes)
        if type(emb) is torch.nn.Embedding and emb.weight.dtype == tgt.dtype and emb.weight.is_contiguous():
            w = emb.weight
            return quant.Part(w.data_ptr(), quant.DENSE, w.shape[0], w.shape[1] * w.element_size())
        return None

    def chain_many(self, part: quant.Part, states: list[torch.Tensor], tokens: list[int],
                   tables: list[tuple[torch.Tensor, torch.Tensor]], caches: list[KVCache], layer: int,
                   vocab: list[tuple[torch.Tensor | None, torch.Tensor | None]]) -> list[torch.Tensor] | None:
        """`chain` for several sequences as one C call (`head_chain_seqs`): each draft depth is
        one step over the sequences still drafting. Per sequence: its (1, 1, D) state, the token
        at its cache's length, its (k_s, hd) rotary tables (k_s drafts), its round vocabulary (ids,
        extra rows). Returns each sequence's (k_s,) tokens, what its own `chain` gives; None
        where a step's logits hold a NaN."""
        tgt = self.head.target
        dt = tgt.dtype
        so = _loaded(dt)[0]
        assert so is not None
        n = len(states)
        ks = [int(c.shape[0]) for c, _ in tables]
        kmax = max(ks, default=0)
        state = torch.cat([st.reshape(1, -1) for st in states]).to(dt).contiguous()  # (n, D)
        cos = [c.to(dt).contiguous() for c, _ in tables]  # kept alive through the call
        sin = [sn.to(dt).contiguous() for _, sn in tables]
        ids = [None if i is None else i.to(torch.int64).contiguous() for i, _ in vocab]
        extra = [None if e is None else e.to(dt).contiguous() for _, e in vocab]
        structs = (_Seq * n)()
        for i, c in enumerate(caches):
            structs[i] = _Seq(row0=i, T=1, start=c.length, S=c.capacity, keys=c.keys[layer].data_ptr(),
                              values=c.values[layer].data_ptr())
        ptrs = lambda ts: (_P * n)(*[None if t is None else t.data_ptr() for t in ts])  # noqa: E731
        out = torch.zeros(n, max(kmax, 1), dtype=torch.int64)
        rc = so.head_chain_seqs(ctypes.byref(self.struct), n, structs, (ctypes.c_int * n)(*ks), state.data_ptr(),
                                (ctypes.c_int64 * n)(*tokens), ptrs(cos), ptrs(sin), ctypes.addressof(self.vocab), self.V1,
                                ptrs(ids), ptrs(extra), (ctypes.c_int * n)(*[0 if e is None else int(e.shape[0]) for e in extra]),
                                ctypes.byref(part), out.data_ptr(), kmax, torch.get_num_threads())
        return None if rc else [out[i, :k] for i, k in enumerate(ks)]


def packed(q: quant.QTensor) -> quant.QTensor:
    """`quant.pack(q)`, the same bytes, by fused.c where the bf16 library runs (SmolLM2's 96 MB:
    0.21 s, numpy 0.45 s); a ValueError for a type without a kernel."""
    kind = quant.packed_type(q)
    so = _loaded(torch.bfloat16)[0]
    if so is None:
        return quant.pack(q)
    O, I = q.shape  # noqa: E741 (the module's letters)
    out = torch.empty(-(-O // quant.COLS), I // 32 * quant.PACKED[kind], dtype=torch.uint8)
    so.fused_pack(q.data.data_ptr(), q.qtype, O, I, q.row_bytes, out.data_ptr())
    return quant.QTensor(kind, q.shape, out)


def quantized_rows(q: quant.QTensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """(R,) ids -> (R, I) those rows of `q` dequantized in `dtype` by fused.c (the values the
    quantized matmuls multiply by), or None where the fused kernels do not run here."""
    so = _loaded(dtype)[0]
    if so is None:
        return None
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < q.shape[0]):
        raise IndexError(f"token ids must lie in [0, {q.shape[0]}); got {int(ids.min())}..{int(ids.max())}")
    out = torch.empty(ids.numel(), q.shape[1], dtype=dtype)
    part = quant.Part(q.data.data_ptr(), q.qtype, q.shape[0], q.row_bytes)
    so.fused_rows(ctypes.addressof(part), ids.data_ptr(), ids.numel(), q.shape[1], out.data_ptr())
    return out
