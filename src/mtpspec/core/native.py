"""Row-invariant fp32 matmul and attention kernels in C (`rowdot.c`), for x86-64 CPUs with
AVX2 and FMA, compiled on first use with the machine's C compiler and cached beside the
kernel plans (`~/.cache/mtpspec/`, or `$MTPSPEC_CACHE`).

Why: on CPUs without avx512_bf16 (AVX2-only Zen 2/3, older Intel, most laptops) bf16 matmuls
are emulated (a 300-token bf16 forward of SmolLM2 took 6 s against 1 s in fp32), and none of
torch's fp32 kernels gives a row the same bits alone and among others (MKL's GEMM paths change
with the row count), so speculative decoding there was exact only up to rounding. These
kernels compute every output in one fixed order (see rowdot.c) and stream each weight once
for all rows: row-invariant by construction, and on such a CPU faster than MKL's one-row GEMV.

Nothing here is required: without a compiler, on another CPU, or with MTPSPEC_NATIVE=0,
`library()` is None and `kernels.choose_plan` never offers these kernels (`reason()` says why).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("rowdot.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
_why: list[str] = []


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build() -> ctypes.CDLL | None:
    if os.environ.get("MTPSPEC_NATIVE", "1") == "0":
        return _fail("disabled by MTPSPEC_NATIVE=0")
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= _cpu_flags():
        return _fail("the CPU has no AVX2 + FMA")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return _fail("no C compiler (cc / gcc / $CC) on PATH")
    root = Path(os.environ.get("MTPSPEC_CACHE", Path.home() / ".cache" / "mtpspec"))
    tag = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *FLAGS)).encode()).hexdigest()[:16]
    lib = root / f"rowdot-{tag}.so"
    if not lib.is_file():
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(tmp)], check=True, capture_output=True, timeout=120)
            tmp.replace(lib)  # atomic: another process may be building the same file
        except (OSError, subprocess.SubprocessError) as e:
            err = getattr(e, "stderr", b"") or b""
            return _fail(f"compiling {SOURCE.name} failed: {e} {err.decode(errors='replace')[-300:]}")
    # torch is imported, so the library's libgomp.so.1 resolves to torch's own copy: one
    # OpenMP runtime and one thread pool, sized by torch.set_num_threads.
    try:
        so = ctypes.CDLL(str(lib))
    except OSError as e:
        return _fail(f"loading {lib} failed: {e}")
    for name in ("rowdot_f32", "mix_f32"):
        fn = getattr(so, name)
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_long] * 3
        fn.restype = None
    return so


def _fail(why: str) -> None:
    _why.append(why)
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot run here (see `reason`)."""
    return _build()


def reason() -> str | None:
    """Why the native kernels are unavailable, or None if they are available."""
    return None if library() is not None else (_why[-1] if _why else "unavailable")


def _check(*ts: torch.Tensor) -> None:
    for t in ts:
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"the native kernels take fp32 CPU tensors, got {t.dtype} on {t.device}")


def rowdot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(R, I) @ (O, I)^T -> (R, O), or batched (B, R, I) @ (B, O, I)^T -> (B, R, O)."""
    so = library()
    assert so is not None, reason()
    _check(x, w)
    x, w = x.contiguous(), w.contiguous()
    xb, wb = (x, w) if x.dim() == 3 else (x[None], w[None])
    B, R, n_in = xb.shape
    n_out = wb.shape[1]
    y = x.new_empty(B, R, n_out)
    so.rowdot_f32(xb.data_ptr(), wb.data_ptr(), y.data_ptr(), B, R, n_in, n_out, R * n_in, n_out * n_in, R * n_out)
    return y if x.dim() == 3 else y[0]


def mix(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, R, S) weights @ (B, S, D) values -> (B, R, D); D a multiple of 8, at most 256."""
    so = library()
    assert so is not None, reason()
    _check(p, v)
    p, v = p.contiguous(), v.contiguous()
    B, R, S = p.shape
    D = v.shape[-1]
    if D % 8 or D > 256:
        raise ValueError(f"mix needs a head dim that is a multiple of 8, at most 256; got {D}")
    y = p.new_empty(B, R, D)
    so.mix_f32(p.data_ptr(), v.data_ptr(), y.data_ptr(), B, R, S, D, R * S, S * D, R * D)
    return y
