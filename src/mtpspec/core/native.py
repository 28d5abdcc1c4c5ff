"""Row-invariant fp32 and bf16 matmul and attention kernels in C (`rowdot.c`), for x86-64 CPUs with
AVX2 and FMA, compiled on first use with the machine's C compiler and cached beside the
kernel plans (`~/.cache/mtpspec/`, or `$MTPSPEC_CACHE`).

Why: on CPUs without avx512_bf16 (AVX2-only Zen 2/3, older Intel, most laptops) bf16 matmuls
are emulated (a 300-token bf16 forward of SmolLM2 took 6 s against 1 s in fp32), and none of
torch's fp32 kernels gives a row the same bits alone and among others (MKL's GEMM paths change
with the row count), so speculative decoding there was exact only up to rounding. These
kernels compute every output in one fixed order (see rowdot.c) and stream each weight once
for all rows: row-invariant by construction, and on such a CPU faster than MKL's one-row GEMV
in fp32; in bf16 (fp32 arithmetic on bf16 operands) they read half the bytes again. Where the
CPU has AVX-512F, fp32 runs on sixteen lanes with four rows per block (`rowdot512_f32`; a
one-token fp32 forward of SmolLM2 34-38 ms against 44 ms with the eight-lane kernel on a
2-core Xeon).

Nothing here is required: without a compiler, on another CPU, or with MTPSPEC_NATIVE=0,
`library()` is None and `kernels.choose_plan` never offers these kernels (`reason()` says why).
The library is built once per source, compiler and flags, and loaded once per process.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("rowdot.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
DTYPES = (torch.float32, torch.bfloat16)


def cache_dir() -> Path:
    """Where mtpspec keeps what it measured or built for this machine (kernel plans, this library)."""
    return Path(os.environ.get("MTPSPEC_CACHE", Path.home() / ".cache" / "mtpspec"))


def save_measured(path: Path, values: dict) -> None:
    """Keep what was measured for this machine (a JSON object) in `path` under `cache_dir()`; a
    read-only home only means measuring again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values) + "\n")
    except OSError:
        pass


def cpuinfo(field: str) -> str:
    """The value of a /proc/cpuinfo field for the first CPU ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def build(source: Path, flags: tuple[str, ...], cpu_flags: set[str]) -> tuple[ctypes.CDLL | None, str | None]:
    """(`source` compiled with `flags` and loaded, None), or (None, why not): the CPU lacks one of
    `cpu_flags`, there is no compiler, or compiling or loading failed. Built once per source,
    compiler and flags into the cache dir (an atomic rename: processes may race)."""
    if platform.machine() not in ("x86_64", "AMD64") or not cpu_flags <= set(cpuinfo("flags").split()):
        return None, f"the CPU lacks one of {', '.join(sorted(cpu_flags))}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc / gcc / $CC) on PATH"
    root = cache_dir()
    tag = hashlib.sha256(source.read_bytes() + " ".join((cc, *flags)).encode()).hexdigest()[:16]
    lib = root / f"{source.stem}-{tag}.so"
    if not lib.is_file():
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            subprocess.run([cc, *flags, str(source), "-o", str(tmp)], check=True, capture_output=True, timeout=120)
            tmp.replace(lib)  # atomic: another process may be building the same file
        except (OSError, subprocess.SubprocessError) as e:
            err = getattr(e, "stderr", b"") or b""
            return None, f"compiling {source.name} failed: {e} {err.decode(errors='replace')[-300:]}"
    # torch is imported, so the library's libgomp.so.1 resolves to torch's own copy: one
    # OpenMP runtime and one thread pool, sized by torch.set_num_threads.
    try:
        return ctypes.CDLL(str(lib)), None
    except OSError as e:
        return None, f"loading {lib} failed: {e}"


@functools.cache
def _loaded() -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled library, None), or (None, why not)."""
    if os.environ.get("MTPSPEC_NATIVE", "1") == "0":
        return None, "disabled by MTPSPEC_NATIVE=0"
    avx512 = "avx512f" in cpuinfo("flags").split()  # then fp32 rowdot runs on 16 lanes (rowdot512_f32)
    so, why = build(SOURCE, FLAGS + (("-mavx512f",) if avx512 else ()), {"avx2", "fma"})
    if so is None:
        return None, why
    for name in ("rowdot_f32", "rowdot_bf16", "rowdot_bf16_f32", "mix_f32", "mix_bf16") + (("rowdot512_f32",) if avx512 else ()):
        fn = getattr(so, name)
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_long] * 3
        fn.restype = None
    return so, None


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot run here (see `reason`)."""
    return _loaded()[0]


def reason() -> str | None:
    """Why the native kernels are unavailable, or None if they are available."""
    return _loaded()[1]


def _check(dtype: torch.dtype, *ts: torch.Tensor) -> None:
    for t in ts:
        if dtype not in DTYPES or t.dtype != dtype or t.device.type != "cpu":
            raise ValueError(f"the native kernels take fp32 or bf16 CPU tensors, all {dtype}; got {t.dtype} on {t.device}")


def rowdot(x: torch.Tensor, w: torch.Tensor, fp32_out: bool = False) -> torch.Tensor:
    """(R, I) @ (O, I)^T -> (R, O), or batched (B, R, I) @ (B, O, I)^T -> (B, R, O); fp32 or
    bf16 operands (fp32 arithmetic), the result in their dtype or, with fp32_out, in fp32."""
    so = library()
    assert so is not None, reason()
    _check(x.dtype, x, w)
    x, w = x.contiguous(), w.contiguous()
    xb, wb = (x, w) if x.dim() == 3 else (x[None], w[None])
    B, R, n_in = xb.shape
    n_out = wb.shape[1]
    bf16 = x.dtype == torch.bfloat16
    y = x.new_empty(B, R, n_out, dtype=torch.float32 if fp32_out or not bf16 else torch.bfloat16)
    fn = (so.rowdot_bf16_f32 if fp32_out else so.rowdot_bf16) if bf16 else getattr(so, "rowdot512_f32", so.rowdot_f32)
    fn(xb.data_ptr(), wb.data_ptr(), y.data_ptr(), B, R, n_in, n_out, R * n_in, n_out * n_in, R * n_out)
    return y if x.dim() == 3 else y[0]


def mix(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, R, S) fp32 weights @ (B, S, D) fp32 or bf16 values -> (B, R, D) in the values'
    dtype; D a multiple of 8, at most 256."""
    so = library()
    assert so is not None, reason()
    _check(torch.float32, p)
    _check(v.dtype, v)
    p, v = p.contiguous(), v.contiguous()
    B, R, S = p.shape
    D = v.shape[-1]
    if D % 8 or D > 256:
        raise ValueError(f"mix needs a head dim that is a multiple of 8, at most 256; got {D}")
    y = v.new_empty(B, R, D)
    fn = so.mix_f32 if v.dtype == torch.float32 else so.mix_bf16
    fn(p.data_ptr(), v.data_ptr(), y.data_ptr(), B, R, S, D, R * S, S * D, R * D)
    return y
