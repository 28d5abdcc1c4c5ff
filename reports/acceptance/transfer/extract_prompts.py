"""Self-written prompts that no shipped or candidate head was trained on, as a prompt file for
`mtpspec acceptance`: the single-turn user requests of `v3-seed2` past its first SKIP samples
(the heads of 2026-11-30 saw at most its first 1,630), evenly spread, tagged `short` or
`passage` (a request over a passage the target wrote first).

    python reports/acceptance/transfer/extract_prompts.py datasets/smollm2-135m-instruct/v3-seed2 1630 48 /tmp/self-written.jsonl
"""
import json
import re
import sys

from mtpspec.models import load_target
from mtpspec.training.shards import load_samples

data, skip, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tok = load_target(None, "bf16").tokenizer
turn = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
found = []
for ids, prompt_len in load_samples(data)[skip:]:
    users = turn.findall(tok.decode(ids[:prompt_len].tolist()))
    if len(users) == 1 and users[0].strip():
        found.append(users[0].strip())
if len(found) < n:
    sys.exit(f"only {len(found)} single-turn prompts past sample {skip}")
pick = [found[i * len(found) // n] for i in range(n)]
with open(out, "w") as f:
    for i, text in enumerate(pick):
        kind = "passage" if len(text) > 400 else "short"
        f.write(json.dumps({"question_id": i, "category": kind, "turns": [text]}) + "\n")
print(f"{len(found)} single-turn prompts past sample {skip}; wrote {n} to {out}")
