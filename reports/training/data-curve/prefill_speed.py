"""How fast the target runs the caching pass's forwards: tokens a second for one whole-sample
forward (hidden states, K/V, the LM head over the last half of the rows, as `activations.activations`
asks), through the fused forward and op by op through torch, alternated, best of three each.

    python reports/training/data-curve/prefill_speed.py [--threads 2] [--lengths 64,290,600]

Run it with nothing else computing. 2026-12-07, a 2-core Zen 4 EPYC (AVX-512 BF16, no AMX), bf16,
the caching job paused: fused 890-1,310 / 1,090-1,100 / 1,040-1,070 tokens a second at 64 / 290 /
600 tokens, torch 210-340 / 390-420 / 390-400 (two rounds each): ~136 GMAC/s at 290 tokens, about
70% of these two cores' AVX-512 BF16 peak, so the caching cannot get much faster here.
"""

from __future__ import annotations

import argparse
import time

import torch

from mtpspec.core.target import Target
from mtpspec.models import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="64,290,600", help="comma-separated sample lengths in tokens")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_target(None, args.dtype).model
    for T in (int(t) for t in args.lengths.split(",")):
        ids = torch.randint(0, model.config.vocab_size - 1, (1, T), generator=torch.Generator().manual_seed(T))
        best: dict[str, list[float]] = {}
        for engine in ("auto", "torch", "auto", "torch"):
            target = Target(model, engine=engine)
            times = []
            for _ in range(4):  # the first is a warm-up
                cache = target.new_cache()
                t0 = time.perf_counter()
                target.forward(ids, cache, (-1,), logits_to_keep=T // 2)
                times.append(time.perf_counter() - t0)
            best.setdefault("fused" if engine == "auto" else "torch", []).append(min(times[1:]))
        print(f"{T} tokens: " + "; ".join(f"{k} " + " / ".join(f"{T / s:,.0f}" for s in v) + " tokens/s"
                                         for k, v in best.items()), flush=True)


if __name__ == "__main__":
    main()
