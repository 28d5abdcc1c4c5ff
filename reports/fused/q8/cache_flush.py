"""How much of a one-token forward's speed comes from weights left in the caches by the previous
forward: the median of 200 forwards (1 and 2 rows, 256 cached tokens) back to back, then with a
buffer of --flush-mib MiB written between forwards (outside the timed part), twice each.

    python reports/fused/q8/cache_flush.py --dtype q8 --flush-mib 16
"""

from __future__ import annotations

import argparse
import time

import torch

from mtpspec.core.target import Target
from mtpspec.models import load_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="q8")
    ap.add_argument("--flush-mib", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(2)
    t = Target(load_target(None, dtype=a.dtype, weights="gguf").model)
    cache = t.new_cache(1024)
    t.forward(torch.randint(0, 40000, (1, 256), generator=torch.Generator().manual_seed(0)), cache)
    one, two = torch.tensor([[42]]), torch.tensor([[42, 43]])
    buf = torch.ones(a.flush_mib * 2**20 // 4)

    def median_ms(rows: torch.Tensor, flush: bool) -> float:
        ts = []
        for _ in range(200):
            if flush:
                buf.add_(1.0)
            cache.length = 256
            t0 = time.perf_counter()
            t.forward(rows, cache)
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[100] * 1e3

    for flush in (False, True, False, True):
        label = f"{a.flush_mib} MiB written between" if flush else "back to back"
        print(f"{a.dtype} {label:>24}: 1 row {median_ms(one, flush):.2f} ms, 2 rows {median_ms(two, flush):.2f} ms")


if __name__ == "__main__":
    main()
