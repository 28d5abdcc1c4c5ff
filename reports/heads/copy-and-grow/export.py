"""Export the head of a run stopped by --max-steps (it keeps only checkpoint.pt) next to it, as
RUN/head-stepN; the architecture and draft vocabulary are read from INIT_HEAD.

    python reports/heads/copy-and-grow/export.py INIT_HEAD RUN_DIR [RUN_DIR ...]
"""
import sys

import torch

from mtpspec.core.target import Target
from mtpspec.models import load_target
from mtpspec.pretrained import load_head

target = Target(load_target(None, "fp32").model)
for run in sys.argv[2:]:
    ckpt = torch.load(f"{run}/checkpoint.pt", weights_only=False)
    head = load_head(sys.argv[1], target)
    head.load_state_dict(ckpt["model"])
    head.save_pretrained(f"{run}/head-step{ckpt['step']}")
    print(run, ckpt["step"])
