"""Decoded acceptance against the trainer's own round walk on the same text: decode the built-in
prompts greedily with a head (bf16), cache the target's activations over each output as
`mtpspec train` does, and score them with `MTPObjective.acceptance` (fp32 head, then bf16).

    python reports/heads/copy-and-grow/probe.py THREADS HEAD_DIR K NEW_TOKENS
"""
import json
import sys

import torch

from mtpspec.core.decode import generate
from mtpspec.core.stats import DecodeStats
from mtpspec.core.target import Target
from mtpspec.models import chat_ids, load_target
from mtpspec.pretrained import load_head
from mtpspec.prompts import load_prompts
from mtpspec.training.activations import Sample
from mtpspec.training.train import MTPObjective, TrainConfig

torch.set_num_threads(int(sys.argv[1]))
head_dir, K, N = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loaded = load_target(None, "bf16")
tb = Target(loaded.model)
hb = load_head(head_dir, tb)
kv = tb.layer_index(hb.config.kv_layer)
samples, stats = [], []
for p in load_prompts(None, 24):
    ids = chat_ids(loaded.tokenizer, p.text)
    out = generate(tb, hb, ids, max_new_tokens=N + K, num_draft_tokens=K)  # K more: the walk needs K labels
    stats.append(out.stats)
    full = out.sequences[0]
    with torch.no_grad():
        cache = tb.new_cache()
        step = tb.forward(full[None], cache, hb.config.hidden_layers)
        keys, values = cache.layer(kv)
        top = step.logits[0].float().log_softmax(-1).topk(32, dim=-1)
    samples.append(Sample(full.long(), ids.shape[-1], step.hidden[0].to(torch.bfloat16),
                          keys[0].to(torch.bfloat16).contiguous(), values[0].to(torch.bfloat16).contiguous(),
                          top.values.half(), top.indices))
print(json.dumps({"decoded": round(DecodeStats.merge(stats).mean_accepted, 4)}))
hf = load_head(head_dir, Target(load_target(None, "fp32").model)).float().eval()
for name, h in (("fp32 head", hf), ("bf16 head", hb.eval())):
    r = MTPObjective(h, TrainConfig(max_draft_tokens=K)).acceptance(samples, 8)
    print(json.dumps({"walk": name, **{k: round(v, 4) for k, v in r.items()}}))
