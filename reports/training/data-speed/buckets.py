"""Length buckets in the data writer's generate calls: the prompts of one written shard (178 rows,
median 69 tokens, longest 586), greedily answered for 48 new tokens in one call over the whole
left-padded batch, then in 2-4 buckets of sorted lengths (cut by hand here; the writer cuts with
`fast_generate.length_buckets`). fp32, 2 threads; run it with nothing else on the machine.

    python reports/training/data-speed/buckets.py SET_DIR [SHARD]
"""

import sys
import time
from pathlib import Path

import torch

from mtpspec.models import load_target
from mtpspec.training.fast_generate import NAME, attention_implementation, length_buckets
from mtpspec.training.shards import read_shard, shard_path

torch.set_num_threads(2)
model = load_target(None, "fp32").model
samples = read_shard(shard_path(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0))
rows = [ids[:p].tolist() for ids, p in samples]
NEW = 48


def generate(rs: list[list[int]]) -> None:
    w = max(len(r) for r in rs)
    ids = torch.tensor([[2] * (w - len(r)) + r for r in rs])
    mask = (torch.arange(w)[None] >= torch.tensor([w - len(r) for r in rs])[:, None]).long()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                       pad_token_id=2)


with attention_implementation(model, NAME):
    t = time.perf_counter()
    generate(rows)
    one = time.perf_counter() - t
    srt = sorted(rows, key=len)
    auto = [len(b) for b in length_buckets([len(r) for r in rows], NEW)]
    cut_sets = [[120], [90, 150], [60, 120, 160], [sum(auto[:i + 1]) for i in range(len(auto) - 1)]]
    for cuts in cut_sets:
        t = time.perf_counter()
        for lo, hi in zip([0, *cuts], [*cuts, len(srt)]):
            generate(srt[lo:hi])
        b = time.perf_counter() - t
        print(f"one call {one:.1f} s; buckets cut at {cuts} (longest {[len(srt[c - 1]) for c in cuts] + [len(srt[-1])]}): "
              f"{b:.1f} s, {one / b:.2f}x", flush=True)
