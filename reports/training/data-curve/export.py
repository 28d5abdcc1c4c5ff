"""Save the head in a training run's checkpoint.pt as a head directory (`mtpspec acceptance --head`).

    python reports/training/data-curve/export.py RUN_DIR OUT_DIR [DRAFT_VOCAB] [MAX_DRAFT_TOKENS] [NUM_BLOCKS]

RUN_DIR may also be a checkpoint file (e.g. a copy of checkpoint.pt kept at an earlier step).

The head config is the CLI's defaults with the given draft vocabulary and draft length (what
run.sh trains); loading the weights is strict, so a different architecture fails loudly.
"""
import json
import sys
from pathlib import Path

import torch

from mtpspec.config import HeadConfig
from mtpspec.core.head import MTPHead
from mtpspec.core.target import Target
from mtpspec.models import load_target

run, out = Path(sys.argv[1]), Path(sys.argv[2])
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
k = int(sys.argv[4]) if len(sys.argv) > 4 else 6
blocks = int(sys.argv[5]) if len(sys.argv) > 5 else 1
state = torch.load(run if run.is_file() else run / "checkpoint.pt", map_location="cpu", weights_only=False)
target = Target(load_target(None, "fp32").model)
head = MTPHead(target, HeadConfig(draft_vocab_size=vocab, trained_draft_tokens=k, num_blocks=blocks), state["model"]["draft_ids"]).float()
head.load_state_dict(state["model"], strict=True)
head.save_pretrained(out)
print(json.dumps({"step": state["step"], "out": str(out)}))
