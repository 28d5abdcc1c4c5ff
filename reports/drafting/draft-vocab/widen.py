"""Widen a trained head's draft vocabulary without training: the head scores the target's own
LM-head rows, so adding rows only lets it draft tokens it could never draft before.

    python reports/drafting/draft-vocab/widen.py HEAD OUT V [V ...]

Writes OUT/V<V> for each V: the head's draft ids, then the most frequent response tokens of all
kept data outside them, up to V ids (V = 0: the whole vocabulary). Also prints, per V, the share
of the kept data's response tokens outside the vocabulary.
"""

import sys
from dataclasses import replace
from pathlib import Path

import torch

from mtpspec import MTPHead, Target
from mtpspec.models import load_target
from mtpspec.training.shards import load_samples

head_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
sizes = [int(v) for v in sys.argv[3:]]
torch.set_num_threads(1)
target = Target(load_target(None, "fp32").model)
head = MTPHead.from_pretrained(head_dir, target)
counts = torch.zeros(target.vocab_size, dtype=torch.long)
for d in sorted(Path("datasets/smollm2-135m-instruct").iterdir()):
    if (d / "manifest.json").is_file():
        for ids, p in load_samples(d):
            counts += torch.bincount(ids[p:].long(), minlength=target.vocab_size)
total = int(counts.sum())
base = head.draft_ids
rest = counts.clone()
rest[base] = -1
order = rest.argsort(descending=True)
state = {k: v for k, v in head.state_dict().items() if k != "draft_ids"}
for V in sizes:
    if V == 0:
        ids, cfg = None, replace(head.config, draft_vocab_size=0)
    else:
        ids = torch.cat([base, order[: V - base.numel()]]).sort().values
        cfg = replace(head.config, draft_vocab_size=V)
    wide = MTPHead(target, cfg, ids)
    wide.load_state_dict(state, strict=False)
    wide.recommended_k = head.recommended_k
    wide.save_pretrained(out / f"V{V}")
    inside = counts[ids].sum() if ids is not None else total
    print(f"V={V or target.vocab_size}: {1 - int(inside) / total:.4f} of {total} response tokens outside", flush=True)
