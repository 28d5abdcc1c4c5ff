"""What caching a sample's activations costs with the teacher's log-probs on every row (before
2026-12-07) against only the rows a loss reads (`activations.activations`: from the last prompt
row on), side by side in one process: the same samples, the two ways alternated, R rounds.

Usage: python reports/training/teacher-rows/time_cache.py [--data DIR] [--samples 64] [--rounds 3]
Prints per round the seconds for all samples each way and their ratio, then min/median/max."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mtpspec.core.target import Target
from mtpspec.models import load_target
from mtpspec.training.activations import activations
from mtpspec.training.shards import DataRef


@torch.no_grad()
def every_row(target: Target, ids: torch.Tensor, kv: int, k: int) -> None:
    """The cache's work before: the LM head, log-softmax and top-k over every row."""
    cache = target.new_cache()
    step = target.forward(ids[None], cache, (-1,))
    keys, values = cache.layer(kv)
    step.logits[0].log_softmax(-1).topk(k, dim=-1)
    step.hidden[0].to(torch.bfloat16), keys[0].to(torch.bfloat16), values[0].to(torch.bfloat16)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="datasets/smollm2-135m-instruct/v9-batch-seed12:4")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    target = Target(load_target(None, "auto").model)
    kv = target.layer_index(-1)
    samples = [(ids[:768], pl) for ids, pl in DataRef.parse(a.data).samples()[:a.samples]]
    tokens = sum(int(i.shape[0]) for i, _ in samples)
    prompt = sum(min(pl, int(i.shape[0])) for i, pl in samples)
    print(f"{target.dtype_name}, {len(samples)} samples, {tokens} tokens ({prompt / tokens:.0%} prompt)")
    for ids, pl in samples[:2]:  # warm up both
        every_row(target, ids, kv, 32)
        activations(target, ids, pl, (-1,), kv, 32)
    ratios = []
    for r in range(a.rounds):
        t0 = time.perf_counter()
        for ids, _ in samples:
            every_row(target, ids, kv, 32)
        t1 = time.perf_counter()
        for ids, pl in samples:
            activations(target, ids, pl, (-1,), kv, 32)
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
        print(f"round {r + 1}: every row {t1 - t0:.2f} s ({tokens / (t1 - t0):.0f} tok/s), answer rows "
              f"{t2 - t1:.2f} s ({tokens / (t2 - t1):.0f} tok/s), {ratios[-1]:.3f}x")
    print(f"speed-up min / median / max: {min(ratios):.3f} / {statistics.median(ratios):.3f} / {max(ratios):.3f}")


if __name__ == "__main__":
    main()
