"""A/B of fused.c variants: one-token and T-token forwards of SmolLM2, interleaved in one process.

    python reports/fused/fused-v3/ab.py DTYPE CONTEXT SRC_A.c [SRC_B.c ...]

Each source is built as fused.c is for DTYPE (fp32 or bf16) and timed in turn, round after
round (median of REPS forwards per round), so a slow minute of the host hits every variant.
Also checks that every variant gives the same logits as the first, bit for bit
(AB_NOCHECK=1 skips that, for variants that leave steps out to time the rest); AB_ROUNDS sets
the number of rounds (5). A measurement script: it points the fused forward at each variant's
library by replacing `fused._loaded` in this process only.
"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from mtpspec.core import fused, native
from mtpspec.core.target import Target
from mtpspec.models import load_target

dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
context = int(sys.argv[2])
sources = [Path(s) for s in sys.argv[3:]]
torch.set_num_threads(2)
target = Target(load_target(None, dtype).model)
libs = []
for s in sources:
    so, why = native.build(s, *fused.BUILDS[dtype])
    assert so is not None, why
    fused._library.cache_clear()
    so.fused_forward.argtypes = fused._library(dtype)[0].fused_forward.argtypes
    so.fused_init(0 if dtype == torch.float32 else 1)
    libs.append(so)
ids = torch.randint(0, target.vocab_size, (1, context + 9), generator=torch.Generator().manual_seed(0))
cache = target.new_cache(context + 9)
use = libs[0]
fused._loaded = lambda dt: (use, None)
target.forward(ids[:, :context], cache, (-1,), logits_to_keep=1)


def run(n):
    out = target.forward(ids[:, context:context + n], cache, (-1,))
    cache.truncate(context)
    return out.logits


REPS, ROUNDS, NS = 11, int(os.environ.get("AB_ROUNDS", 5)), (1, 5, 9)
ref = None
times = {(i, n): [] for i in range(len(libs)) for n in NS}
for _ in range(ROUNDS):
    for i, so in enumerate(libs):
        use = so
        got = run(9)
        if ref is None:
            ref = got
        assert os.environ.get("AB_NOCHECK") or torch.equal(got, ref), f"{sources[i]} differs from {sources[0]}"
        for n in NS:
            ts = []
            for _ in range(REPS):
                t0 = time.perf_counter()
                run(n)
                ts.append(time.perf_counter() - t0)
            times[i, n].append(statistics.median(ts))
for i, s in enumerate(sources):
    med = {n: statistics.median(times[i, n]) * 1e3 for n in NS}
    print(f"{s.name:28s} " + "  ".join(f"{n}: {med[n]:6.2f} ms" for n in NS)
          + f"  5/1 {med[5] / med[1]:.3f}x  9/1 {med[9] / med[1]:.3f}x"
          + "  rounds 5/1: " + " ".join(f"{a / b:.3f}" for a, b in zip(times[i, 5], times[i, 1])))
