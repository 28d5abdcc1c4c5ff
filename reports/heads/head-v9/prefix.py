"""A read-only view of the first N shards of a kept data set, to train on part of a set when
caching all of it does not fit a session (fp32 caching runs at ~250 tokens per second on an
AVX2-only CPU):

    python reports/heads/head-v9/prefix.py datasets/smollm2-135m-instruct/v5-seed5 10 runs/v5-seed5-first10

The view links the shards and writes a manifest with their counts; its settings are the set's
own, so an activation cache of the whole set reuses its finished shards for the view. Never
extend a view with `mtpspec data` (extend the set itself).
"""
import sys
from pathlib import Path

from mtpspec.training.shards import read_manifest, read_shard, save_manifest, shard_path

src, n, out = Path(sys.argv[1]).resolve(), int(sys.argv[2]), Path(sys.argv[3])
m = read_manifest(src)
if not 0 < n <= m["num_shards"]:
    sys.exit(f"{src} has {m['num_shards']} shards; ask for 1..{m['num_shards']}")
out.mkdir(parents=True, exist_ok=True)
for i in range(n):
    link = out / shard_path(src, i).name
    link.unlink(missing_ok=True)
    link.symlink_to(shard_path(src, i))
samples = [s for i in range(n) for s in read_shard(shard_path(src, i))]
answers = sum(len(ids) - p for ids, p in samples)
save_manifest(out, {**{k: v for k, v in m.items() if k != "prompt_hashes"}, "num_shards": n,
                    "num_samples": len(samples), "num_tokens": sum(len(ids) for ids, _ in samples),
                    "num_response_tokens": answers, "view_of": str(src)})
print(f"{out}: the first {n} of {m['num_shards']} shards of {src.name}, {len(samples)} samples, {answers} response tokens")
