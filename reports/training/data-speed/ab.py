"""Data generation, HF's own (attention and top-p sampling) against `fast_generate`: one batch
each of the default chat recipe, the same seeds, one after the other on one thread, with the
time of every batched `generate` call (stage) of the batch.

    python reports/training/data-speed/ab.py BATCH_SIZE hf,fast,hf,fast

Writes into /tmp/mtpspec-data-speed/; run it with nothing else on the machine.
"""

import shutil
import sys
import time
from pathlib import Path

import torch

import mtpspec.training.data as data
from mtpspec.models import load_target

torch.set_num_threads(1)
loaded = load_target(None, "bf16")
batch_size, order = int(sys.argv[1]), sys.argv[2].split(",")
fast_generation = data.generation
plain_generate = data._Writer.generate


def timed(self, rows, max_new, temperature):
    t = time.perf_counter()
    new = plain_generate(self, rows, max_new, temperature)
    dt = time.perf_counter() - t
    if rows:
        steps = max(len(n) for n in new)
        print(f"  {'sampled' if temperature > 0 else 'greedy '} rows {len(rows):4d}, widest prompt {max(map(len, rows)):4d}, "
              f"{steps:4d} steps, {sum(map(len, new)):6d} new tokens: {dt:6.1f} s, {dt / max(steps, 1) * 1e3:5.0f} ms/step",
              flush=True)
    return new


data._Writer.generate = timed
for i, kind in enumerate(order):
    out = Path(f"/tmp/mtpspec-data-speed/{kind}-{i}")
    shutil.rmtree(out, ignore_errors=True)
    data.generation = (lambda model: None) if kind == "hf" else fast_generation  # None: HF's own, as older sets
    print(kind, flush=True)
    t = time.perf_counter()
    m = data.generate_data(loaded.model, loaded.tokenizer, out, data.DataConfig(num_samples=1, batch_size=batch_size, seed=7),
                           progress=False)
    dt = time.perf_counter() - t
    print(f"{kind}: {dt:.1f} s, {m['num_samples']} samples, {m['num_response_tokens']} response tokens "
          f"({m['num_response_tokens'] / dt:.1f}/s), {m['num_tokens']} tokens", flush=True)
