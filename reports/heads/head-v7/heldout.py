"""Held-out acceptance of saved heads on the split `mtpspec train` makes (seed 0, holdout 0.04), read
from a run's activation caches:

    python reports/heads/head-v7/heldout.py THREADS RUN_DIR HEAD_DIR [HEAD_DIR ...] [--holdout 0.04] [-k 6]

(`--holdout` must be the run's own; the ablations in reports/training/ablations-v3.md held out 0.08.)
"""
import json
import sys
from pathlib import Path

import torch

from mtpspec.core.target import Target
from mtpspec.models import auto_autocast, load_target
from mtpspec.pretrained import load_head
from mtpspec.training.activations import Samples, load_cache
from mtpspec.training.train import MTPObjective, TrainConfig, split

args = sys.argv[1:]
opts = {"--holdout": 0.04, "-k": 6}
for flag in opts:
    if flag in args:
        i = args.index(flag)
        opts[flag] = float(args[i + 1])
        del args[i:i + 2]
torch.set_num_threads(int(args[0]))
run, heads = args[1], args[2:]
cfg = TrainConfig(holdout=opts["--holdout"], max_draft_tokens=int(opts["-k"]), bf16=auto_autocast())  # as `mtpspec train` defaults
held = Samples([])
for d in sorted(Path(run).glob("activations*"), key=lambda p: (len(p.name), p.name)):
    held = held + split(load_cache(d), cfg)[1]
target = Target(load_target(None, "fp32").model)
for h in heads:
    head = load_head(h, target).float().eval()
    r = MTPObjective(head, cfg).acceptance(held, 16)
    print(json.dumps({"head": h, "n": len(held), **{k: round(v, 4) for k, v in r.items()}}), flush=True)
