"""Run by tests/test_train.py under torchrun: trains the tiny head on cached activations."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tiny_model

from mtpspec import HeadConfig, Target
from mtpspec.config import TrainConfig
from mtpspec.training.train import train

torch.set_num_threads(1)
cache_dir, out_dir = sys.argv[1], sys.argv[2]
cfg = TrainConfig(epochs=2, min_steps=0, batch_size=8, lr=3e-3, warmup_steps=2, warmup_fraction=1.0, eval_every=1000,
                  save_every=1000, holdout=0.0, max_draft_tokens=3, bf16=False)
train(Target(tiny_model("llama")), cache_dir, out_dir, cfg, HeadConfig(), progress=False)
