"""Held-out acceptance of saved heads on the split `mtpspec train` makes (seed 0, holdout 0.04), read
from a run's activation caches:

    python reports/head-v7/heldout.py THREADS RUN_DIR HEAD_DIR [HEAD_DIR ...]
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
run, heads = sys.argv[2], sys.argv[3:]
cfg = TrainConfig(holdout=0.04, max_draft_tokens=6)
held = Samples([])
for d in sorted(Path(run).glob("activations*"), key=lambda p: (len(p.name), p.name)):
    held = held + split(load_cache(d), cfg)[1]
target = Target(load_target(None, "fp32").model)
for h in heads:
    head = load_head(h, target).float().eval()
    r = MTPObjective(head, cfg).acceptance(held, 16)
    print(json.dumps({"head": h, "n": len(held), **{k: round(v, 4) for k, v in r.items()}}), flush=True)
