# Historical: ran on commit 726250b (2026-12-01); imports internals that have since changed; kept as the record.
# (fp32 now runs the fused forward where the CPU has AVX-512F, so swapping native.rowdot's kernel no longer
# changes what a target forward runs.)
"""fp32 target forwards with mtpspec's 16-lane (AVX-512F) and 8-lane (AVX2) row-invariant
matmul kernels, side by side in one process: `python reports/bench/bench-fused/ab_fp32_rowdot.py`."""

import time

import torch

from mtpspec.core import native
from mtpspec.core.target import Target
from mtpspec.models import load_target

torch.set_num_threads(2)
target = Target(load_target(dtype="fp32").model)
so = native.library()
assert so is not None and hasattr(so, "rowdot512_f32"), native.reason() or "no AVX-512F here"
kernels = {"avx512": so.rowdot512_f32, "avx2": so.rowdot_f32}
ids = torch.randint(0, 1000, (1, 256))
cache = target.new_cache(512)
target.forward(ids, cache)


def forward_ms(T: int, reps: int = 8) -> float:
    """Fastest of `reps` forwards over T new tokens after the 256 cached ones."""
    new = torch.randint(0, 1000, (1, T))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        target.forward(new, cache)
        times.append(time.perf_counter() - t0)
        cache.truncate(256)
    return min(times) * 1e3


for _ in range(2):
    for name, fn in kernels.items():
        so.rowdot512_f32 = fn  # native.rowdot calls this one for fp32
        ms = [forward_ms(T) for T in (1, 2, 5, 9)]
        print(name, [round(m, 1) for m in ms], f"5/1 = {ms[2] / ms[0]:.2f}")
