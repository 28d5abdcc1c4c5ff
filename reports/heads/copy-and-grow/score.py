"""Greedy acceptance of saved heads, teacher-forced, on two held-out sets: the split `mtpspec train`
makes of a run's caches (seed 0, holdout 0.04) and every sample of extra activation caches (data
no head here trained on). COPY = 1 scores each row's context tokens as drafting does
(`--copy-context`), 0 the draft vocabulary only.

    python reports/heads/copy-and-grow/score.py THREADS COPY RUN_DIR EXTRA_CACHE[,EXTRA_CACHE...] HEAD_DIR [HEAD_DIR ...]
"""
import json
import sys
from pathlib import Path

import torch

from mtpspec.core.target import Target
from mtpspec.models import load_target
from mtpspec.pretrained import load_head
from mtpspec.training.activations import Samples, load_cache
from mtpspec.training.train import MTPObjective, TrainConfig, split

torch.set_num_threads(int(sys.argv[1]))
copy, run, extra, heads = sys.argv[2] == "1", sys.argv[3], sys.argv[4].split(","), sys.argv[5:]
cfg = TrainConfig(holdout=0.04, max_draft_tokens=6, copy_context=copy)
held, new = Samples([]), Samples([])
for d in sorted(Path(run).glob("activations*"), key=lambda p: (len(p.name), p.name)):
    held = held + split(load_cache(d), cfg)[1]
for d in extra:
    new = new + load_cache(d)
target = Target(load_target(None, "fp32").model)
for h in heads:
    head = load_head(h, target).float().eval()
    obj = MTPObjective(head, cfg)
    for name, s in (("held-out split", held), ("new samples", new)):
        r = obj.acceptance(s, 16)
        print(json.dumps({"head": h, "copy": copy, "set": name, "n": len(s), **{k: round(v, 4) for k, v in r.items()}}),
              flush=True)
