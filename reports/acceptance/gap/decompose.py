"""Where a head's held-out acceptance comes from: the trainer's greedy round walk over the
held-out split of a run's activation caches (the split `mtpspec train` makes, as
reports/heads/head-v7/heldout.py), broken down by kind of sample and by where in the answer a round
starts, so it can be set beside decoding on the built-in prompts (64 new tokens, single turn).

    python reports/acceptance/gap/decompose.py THREADS RUN_DIR HEAD_DIR [--holdout 0.04] [-k 6] [--out rows.json]

A sample's kind comes from its prompt: `follow-up` (two or more user turns), `passage` (one
user turn over 400 characters: a request over a passage), else `short`. Tokens per forward of
a group = (accepted drafts + 1) summed over its rounds / its rounds.
"""
import json
import re
import sys
from pathlib import Path

import torch

from mtpspec.core.target import Target
from mtpspec.models import auto_autocast, load_target
from mtpspec.pretrained import load_head
from mtpspec.training.activations import load_cache
from mtpspec.training.train import MTPObjective, TrainConfig, split

args = sys.argv[1:]
opts = {"--holdout": "0.04", "-k": "6", "--out": ""}
for flag in opts:
    if flag in args:
        i = args.index(flag)
        opts[flag] = args[i + 1]
        del args[i:i + 2]
torch.set_num_threads(int(args[0]))
run, head_dir = args[1], args[2]
cfg = TrainConfig(holdout=float(opts["--holdout"]), max_draft_tokens=int(opts["-k"]), bf16=auto_autocast())
loaded = load_target(None, "fp32")
target, tok = Target(loaded.model), loaded.tokenizer
head = load_head(head_dir, target).float().eval()
objective = MTPObjective(head, cfg)
user = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)

rows = []
for d in sorted(Path(run).glob("activations*"), key=lambda p: (len(p.name), p.name)):
    held = split(load_cache(d), cfg)[1]
    for i, (ids, prompt_len) in enumerate(held.tokens()):
        turns = user.findall(tok.decode(ids[:prompt_len].tolist()))
        kind = "follow-up" if len(turns) > 1 else "passage" if turns and len(turns[0]) > 400 else "short"
        walk = [w for _, walks in objective.round_walks(held.pick([i]), 1) for w in walks][0]
        rows.append({"cache": d.name, "kind": kind, "prompt_tokens": prompt_len,
                     "answer_tokens": len(ids) - prompt_len, "walk": walk})


def summary(accepted: list[int]) -> str:
    """Tokens per forward over rounds that accepted these draft counts."""
    return f"{sum(a + 1 for a in accepted) / max(1, len(accepted)):.3f} ({len(accepted)} rounds)"


def rounds_of(rs, lo=0, hi=10**9) -> list[int]:
    """The accepted drafts of the rounds of samples `rs` that start at answer positions lo..hi-1."""
    out = []
    for r in rs:
        pos = 0
        for a in r["walk"]:
            if lo <= pos < hi:
                out.append(a)
            pos += a + 1
    return out


groups = {"all": rows, **{k: [r for r in rows if r["kind"] == k] for k in ("short", "passage", "follow-up")},
          **{c: [r for r in rows if r["cache"] == c] for c in sorted({r["cache"] for r in rows})}}
print("| group | samples | mean answer tokens | whole answer | rounds starting before token 64 | after |")
print("|---|---:|---:|---|---|---|")
for name, rs in groups.items():
    mean_len = sum(r["answer_tokens"] for r in rs) / max(1, len(rs))
    print(f"| {name} | {len(rs)} | {mean_len:.0f} | {summary(rounds_of(rs))} | {summary(rounds_of(rs, 0, 64))} "
          f"| {summary(rounds_of(rs, 64))} |")
if opts["--out"]:
    Path(opts["--out"]).write_text(json.dumps(rows) + "\n")
