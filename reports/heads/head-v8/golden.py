"""The golden check's acceptance for a saved head: every 3rd built-in prompt, 48 new tokens,
k = 4, greedy, bf16 (what tests/test_golden.py holds the shipped head to).

    python reports/heads/head-v8/golden.py HEAD_DIR [HEAD_DIR ...]
"""

import sys

import torch

import mtpspec
from mtpspec.core.stats import DecodeStats
from mtpspec.models import chat_ids, load_target
from mtpspec.prompts import load_prompts

torch.set_num_threads(2)
loaded = load_target(None, "bf16")
target = mtpspec.Target(loaded.model)
prompts = load_prompts(None)[::3]
for path in sys.argv[1:]:
    head = mtpspec.MTPHead.from_pretrained(path, target)
    runs = []
    for p in prompts:
        ids = chat_ids(loaded.tokenizer, p.text)
        runs.append(mtpspec.generate(target, head, ids, max_new_tokens=48, num_draft_tokens=4).stats)
    print(f"{path}: golden acceptance {DecodeStats.merge(runs).mean_accepted:.3f}")
