"""Freeze the data the curve is trained on: the first FRACTION of each kept set's shards, copied
with a manifest recounted for them (the kept sets keep growing, and one session's CPU time does
not cache and train on all of them).
    python reports/training/data-curve/freeze.py FRACTION OUT_DIR SET_DIR...
"""

import math
import shutil
import sys
from pathlib import Path

from mtpspec.training.shards import MANIFEST, read_manifest, read_shard, save_manifest, shard_path

fraction, out, sets = float(sys.argv[1]), Path(sys.argv[2]), [Path(s) for s in sys.argv[3:]]
for src in sets:
    m = read_manifest(src)
    n = max(1, math.ceil(m["num_shards"] * fraction))
    dst = out / src.name
    dst.mkdir(parents=True, exist_ok=True)
    samples = []
    for i in range(n):
        shutil.copy2(shard_path(src, i), dst)
        samples += read_shard(shard_path(src, i))
    m.update(num_shards=n, num_samples=len(samples), num_tokens=sum(len(s) for s, _ in samples),
             num_response_tokens=sum(len(s) - p for s, p in samples))
    save_manifest(dst, m)
    print(f"{src.name}: {n} shards, {len(samples)} samples, {m['num_response_tokens']} response tokens")
assert all((out / s.name / MANIFEST).is_file() for s in sets)
