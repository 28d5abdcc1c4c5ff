"""The few tensor kernels a forward pass spends its time in, chosen per machine and dtype so
that each row's result does not depend on how many rows run together.

Letters: R rows (tokens in one forward), I input features, O output features, H query heads,
Hk key/value heads, S cache slots, hd head dim.

Why: a verify pass runs k + 1 rows through the target where plain decoding runs one. If a
matmul or an attention kernel takes another code path for 1 row than for 5 (MKL does: one
row is a GEMV with its own summation order), the verified logits differ from plain decoding's
in the last bits, and in bf16 that flips a greedy choice now and then. Speculative output is
then no longer the output of plain decoding. Here every candidate kernel is checked on this
machine: a row computed alone must equal, bit for bit, the same row computed among 2..R_MAX
others. Among the candidates that pass, the fastest is used; the choice is cached on disk per
CPU, torch version and dtype (`~/.cache/mtpspec/`, or `$MTPSPEC_CACHE`).

Candidates:
- linear: `F.linear(x, W)`, `(W @ x^T)^T`, each optionally with a single row padded to two
  (on this machine's bf16 AMX path two rows cost half of one; fp32 MKL agrees from two rows on).
- attention, all over all S slots with a mask, so the reduction length never depends on the
  row count: PyTorch's fused `scaled_dot_product_attention`; a plain matmul-softmax-matmul
  with fp32 scores, rows stacked along the GEMM's M dimension ("manual"); the same with the
  cache as the GEMM's left operand and the rows as its N dimension ("kqt": K q^T, V^T P^T),
  the layout that kept rows bit-identical for every cache size tried here.
- "rowdot", linear and attention, fp32 and bf16 on x86-64 CPUs with AVX2 + FMA: mtpspec's own
  C kernels (`native.py`), row-invariant by construction; where no torch fp32 kernel is
  (AVX2-only CPUs: MKL's GEMM paths change with the row count), the only exact choice, and
  there faster than MKL's one-row GEMV as well; in bf16 there, where torch emulates bf16
  matmuls, several times faster than torch's.
A model whose attention scores are soft-capped (Gemma 2: cap * tanh(scores / cap)) never uses
"sdpa": the fused kernel has no step between the scores and the softmax.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import native

R_MAX = 16  # most rows checked for invariance (a verify pass of k + 1 <= 16 tokens)
LINEAR_KINDS = ("linear", "linear_pad2", "wxt", "wxt_pad2", "rowdot")
ATTENTION_KINDS = ("sdpa", "manual", "kqt", "rowdot")
CHECK_SLOTS = (64, 320, 1024, 2048)  # cache sizes at which attention must be row-invariant


@dataclass(frozen=True)
class KernelPlan:
    # How a (R, I) x (O, I)^T product is computed (see LINEAR_KINDS).
    linear: str = "linear_pad2"
    # How attention over the cache is computed (see ATTENTION_KINDS).
    attention: str = "kqt"
    # Whether every row came out bit-identical whatever the row count when this plan was
    # chosen; False only if no candidate passed (then outputs are exact in fp32 up to rounding).
    row_invariant: bool = True

    def __post_init__(self) -> None:
        if self.linear not in LINEAR_KINDS or self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown kernel plan {self}")


# -- the kernels ------------------------------------------------------------------------------
def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, kind: str) -> torch.Tensor:
    """(R, I) @ (O, I)^T + b -> (R, O)."""
    if kind == "rowdot":
        y = native.rowdot(x, w)
        return y if b is None else y + b
    R = x.shape[0]
    pad = R == 1 and kind.endswith("_pad2")
    if pad:
        x = torch.cat([x, x], 0)  # (2, I): the two-row path, then keep the first row
    if kind.startswith("wxt"):
        # contiguous: a transposed view would send the next elementwise op (SiLU) down a
        # strided path whose rounding differs from the contiguous one used for other row counts
        y = (w @ x.T).T.contiguous()  # (R, O)
    else:
        y = F.linear(x, w)  # (R, O)
    if pad:
        y = y[:1]
    return y if b is None else y + b


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
              kind: str, softcap: float | None = None) -> torch.Tensor:
    """q (B, H, R, hd), k/v (B, Hk, S, hd), mask (R, S) or (B, R, S) bool (True = may attend)
    -> (B, H, R, hd). A batch of B is B independent problems of the same shape: the decode loop
    uses B > 1 for draft trees, one row per batch element (see `Target.forward`).
    softcap: scaled scores become softcap * tanh(scores / softcap) before the mask, as Gemma 2
    computes them (elementwise: each row stays its own); "sdpa" has no such step and refuses it."""
    B, H, R, hd = q.shape
    Hk, S = k.shape[1], k.shape[2]
    m = mask if mask.dim() == 2 else mask[:, None]  # (R, S) or (B, 1, R, S): broadcast over heads
    if kind == "sdpa":
        if softcap is not None:
            raise ValueError("the fused attention kernel cannot soft-cap scores; use 'manual' or 'kqt'")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale, enable_gqa=Hk != H)
    g = H // Hk  # query heads per key/value head
    qg = q.reshape(B, Hk, g * R, hd)  # (B, Hk, gR, hd): heads of a group share their keys
    if kind == "rowdot":  # fp32 scores, one dot product each, fp32 weights, the weighted sum in slot order
        s = native.rowdot(qg.reshape(B * Hk, g * R, hd), k.reshape(B * Hk, S, hd), fp32_out=True).view(B, H, R, S) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        p = torch.where(m, s, float("-inf")).softmax(-1)  # (B, H, R, S)
        return native.mix(p.view(B * Hk, g * R, S), v.reshape(B * Hk, S, hd)).view(B, H, R, hd)
    if kind == "manual":
        s = (qg @ k.transpose(-1, -2)).float().view(B, H, R, S) * scale  # (B, H, R, S)
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        p = s.masked_fill(~m, float("-inf")).softmax(-1).to(v.dtype)
        return (p.view(B, Hk, g * R, S) @ v).view(B, H, R, hd)
    n = g * R  # "kqt": query rows are the GEMM's N columns, at least two (see `linear`)
    if n == 1:
        qg = torch.cat([qg, qg], 2)
    s = (k @ qg.transpose(-1, -2))[..., :n]  # (B, Hk, S, gR)
    # one copy transposes and widens (exactly) to fp32; every op here is one call per layer
    s = torch.empty(B, Hk, n, S, dtype=torch.float32, device=s.device).copy_(s.transpose(-1, -2)).view(B, H, R, S) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    p = torch.where(m, s, float("-inf")).softmax(-1).to(v.dtype).view(B, Hk, n, S)  # (B, Hk, gR, S)
    if n == 1:
        p = torch.cat([p, p], 2)
    out = (v.transpose(-1, -2) @ p.transpose(-1, -2))[..., :n]  # (B, Hk, hd, gR)
    return out.transpose(-1, -2).contiguous().view(B, H, R, hd)


# -- choosing a plan on this machine ----------------------------------------------------------
def _best_us(fn: Callable[[], object], reps: int = 30) -> float:
    """The fastest of `reps` timings: the least disturbed by whatever else the machine runs."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e6


def _rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    """fn maps (R, ...) rows to (R, ...) results; True if row i alone equals row i of any batch."""
    alone = [fn(x[i:i + 1]) for i in range(x.shape[0])]
    for r in range(2, x.shape[0] + 1):
        together = fn(x[:r])
        if any(not torch.equal(together[i:i + 1], alone[i]) for i in range(r)):
            return False
    return True


def _check_linear(kind: str, dtype: torch.dtype, shapes: dict[tuple[int, int], int]) -> tuple[bool, float]:
    """Row-invariant for every shape? And the time of one forward's matmuls over 1 and 5 rows
    (each shape's time times its number of uses)."""
    g = torch.Generator().manual_seed(0)
    ok, cost = True, 0.0
    for (n_out, n_in), uses in shapes.items():
        w = torch.randn(n_out, n_in, generator=g).to(dtype)
        x = torch.randn(R_MAX, n_in, generator=g).to(dtype)
        ok = ok and _rows_invariant(lambda rows, w=w: linear(rows, w, None, kind), x)
        one = _best_us(lambda w=w, x=x: linear(x[:1], w, None, kind))
        cost += uses * (one + _best_us(lambda w=w, x=x: linear(x[:5], w, None, kind)))
    return ok, cost


def _check_attention(kind: str, dtype: torch.dtype, H: int, Hk: int, hd: int, S: int = 320,
                     softcap: float | None = None) -> tuple[bool, float]:
    g = torch.Generator().manual_seed(1)
    k = torch.randn(1, Hk, S, hd, generator=g).to(dtype)
    v = torch.randn(1, Hk, S, hd, generator=g).to(dtype)
    q = torch.randn(1, H, R_MAX, hd, generator=g).to(dtype)
    L = S - R_MAX - 7  # rows at positions L.. attend slots 0..their position
    mask = torch.arange(S)[None, :] <= torch.arange(L, L + R_MAX)[:, None]  # (R, S)

    def rows(idx: slice) -> torch.Tensor:
        return attention(q[:, :, idx], k, v, mask[idx], hd**-0.5, kind, softcap)[0].transpose(0, 1)  # (R, H, hd)

    alone = [rows(slice(i, i + 1)) for i in range(R_MAX)]
    ok = True
    for r in range(2, R_MAX + 1):
        together = rows(slice(0, r))
        ok = ok and all(torch.equal(together[i:i + 1], alone[i]) for i in range(r))
    cost = _best_us(lambda: rows(slice(0, 1))) + _best_us(lambda: rows(slice(0, 5)))
    return ok, cost


def _cache_file(dtype: torch.dtype, key: str) -> Path:
    cpu = native.cpuinfo("model name")
    ident = f"{platform.machine()}|{platform.processor()}|{cpu}|{torch.__version__}|{torch.get_num_threads()}|{dtype}|{key}"
    return native.cache_dir() / f"kernels-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def choose_plan(dtype: torch.dtype, linear_shapes: dict[tuple[int, int], int], heads: tuple[int, int, int],
                num_layers: int = 1, use_cache: bool = True, softcap: float | None = None,
                on_cpu: bool = True) -> KernelPlan:
    """The fastest row-invariant kernels on this machine for weights of these (out, in) shapes
    (each used that many times per forward) and attention with (H, Hk, hd) heads in each of
    `num_layers` layers, its scores soft-capped at `softcap` if given. Takes several seconds the
    first time; later calls read the cached choice. on_cpu=False (a model on an accelerator)
    leaves out mtpspec's own CPU kernels."""
    H, Hk, hd = heads
    native_ok = on_cpu and dtype in native.DTYPES and native.library() is not None
    key = f"{sorted(linear_shapes.items())}|{heads}|{num_layers}" + ("" if softcap is None else f"|softcap={softcap}")
    key += "|native" if native_ok else ""  # plans cached before the native kernels existed lack them
    key += "512" if native_ok and hasattr(native.library(), "rowdot512_f32") else ""  # and their AVX-512 fp32 variant
    lin_kinds = tuple(k for k in LINEAR_KINDS if native_ok or k != "rowdot")
    kinds = tuple(k for k in ATTENTION_KINDS if (softcap is None or k != "sdpa")
                  and (k != "rowdot" or (native_ok and hd % 8 == 0 and hd <= 256)))
    path = _cache_file(dtype, key)
    if use_cache and path.is_file():
        try:
            return KernelPlan(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a stale or corrupt cache file: measure again
    lin = {kind: _check_linear(kind, dtype, linear_shapes) for kind in lin_kinds}
    att = {}
    for kind in kinds:
        checks = [_check_attention(kind, dtype, H, Hk, hd, S, softcap) for S in CHECK_SLOTS]
        att[kind] = (all(ok for ok, _ in checks), num_layers * sum(cost for _, cost in checks))
    good_lin = [k for k, (ok, _) in lin.items() if ok]
    good_att = [k for k, (ok, _) in att.items() if ok]
    plan = KernelPlan(
        linear=min(good_lin or lin_kinds, key=lambda k: lin[k][1]),
        attention=min(good_att or kinds, key=lambda k: att[k][1]),
        row_invariant=bool(good_lin and good_att),
    )
    if use_cache:
        native.save_measured(path, asdict(plan))
    return plan
