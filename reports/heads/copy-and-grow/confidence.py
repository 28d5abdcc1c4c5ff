"""First-draft hits by the target's own confidence: is the head missing easy tokens or near-ties?
Each prompt is decoded greedily (bf16, k = 4, 64 tokens); then every answer row t is scored:
the head's first draft (and its top 4) for x_{t+2} against the target's token, bucketed by the
target's own top-1 probability of that token.

    python reports/heads/copy-and-grow/confidence.py HEAD_DIR builtin|PROMPTS.jsonl
"""
import sys

import torch

from mtpspec.core.decode import generate
from mtpspec.core.target import Target
from mtpspec.models import chat_ids, load_target
from mtpspec.pretrained import load_head
from mtpspec.prompts import load_prompts

torch.set_num_threads(1)
head_dir, which, N = sys.argv[1], sys.argv[2], 64
path = None if which == "builtin" else which
loaded = load_target(None, "bf16")
target = Target(loaded.model)
head = load_head(head_dir, target)
vocab = head.draft_ids
in_vocab = set(vocab.tolist())
buckets: dict[int, list[int]] = {}  # target p(top1) decile -> [rows, hits, in head top 4, outside vocab]
for p in load_prompts(path, 24 if path is None else 48):
    ids = chat_ids(loaded.tokenizer, p.text)
    full = generate(target, head, ids, max_new_tokens=N, num_draft_tokens=4).sequences[0]
    with torch.no_grad():
        cache = target.new_cache()
        step = target.forward(full[None], cache, head.config.hidden_layers)
        keys, values = cache.layer(target.layer_index(head.config.kv_layer))
        logits = head(step.hidden, full[None], keys, values, 1)[0][1][0]  # (T, V'): row t drafts x_{t+2}
        sure = step.logits[0].float().softmax(-1).max(-1).values  # (T,): row t+1's top-1 probability
    for t in range(ids.shape[-1] - 1, full.shape[0] - 2):
        y = int(full[t + 2])
        top = vocab[logits[t].float().topk(4).indices].tolist()
        r = buckets.setdefault(min(9, int(float(sure[t + 1]) * 10)), [0, 0, 0, 0])
        r[0], r[1], r[2], r[3] = r[0] + 1, r[1] + (top[0] == y), r[2] + (y in top), r[3] + (y not in in_vocab)
tot = [sum(v[i] for v in buckets.values()) for i in range(4)]
print(f"{head_dir} {which}: rows {tot[0]}, first-draft hit {tot[1] / tot[0]:.3f}, in head top-4 "
      f"{tot[2] / tot[0]:.3f}, outside draft vocab {tot[3] / tot[0]:.3f}")
print("| target p(top1) | rows | share | head top-1 hit | in head top-4 | outside draft vocab |")
print("|---|---|---|---|---|---|")
for b in sorted(buckets):
    n, h, h4, o = buckets[b]
    print(f"| {b / 10:.1f}-{(b + 1) / 10:.1f} | {n} | {n / tot[0]:.2f} | {h / n:.2f} | {h4 / n:.2f} | {o / n:.2f} |")
