"""Wall time and tokens per forward of the chain (k = 2) against 8-node cost-shaped trees at given
prices (row/step, plane 0), interleaved prompt by prompt, bf16. Run with nothing else running:
    python reports/fused/fused-v2/tree_prices.py specbench 0.03/0.05 0.03/0.1   # or: builtin ...
"""
import sys, time, torch
torch.set_num_threads(2)
import transformers; transformers.logging.set_verbosity_error()
from mtpspec.models import load_target, chat_ids
from mtpspec.core.target import Target
from mtpspec.core.drafters import TreeDrafter, TreeConfig, RoundCosts
from mtpspec.pretrained import load_head, shipped_head_dir
from mtpspec.prompts import load_prompts
import mtpspec
ld = load_target(None, "bf16")
t = Target(ld.model)
head = load_head(shipped_head_dir("smollm2-135m-instruct"), t)
path = None if sys.argv[1] == "builtin" else "../shared/data/spec_bench/question.jsonl"
prompts = load_prompts(path, limit=None if path is None else 48)
ids = [chat_ids(ld.tokenizer, p.text) for p in prompts]
V = {"chain": None}
for spec in sys.argv[2:]:
    row, step = map(float, spec.split("/"))
    V[spec] = RoundCosts(row=row, plane=0.0, step=step)
eos = ld.tokenizer.eos_token_id
mtpspec.generate(t, head, ids[0], max_new_tokens=20, num_draft_tokens=2, eos_token_id=eos)
tot = {k: [0, 0, 0.0] for k in V}
for i, x in enumerate(ids):
    names = list(V)[i % len(V):] + list(V)[:i % len(V)]
    for name in names:
        c = V[name]
        t0 = time.perf_counter()
        if c is None: out = mtpspec.generate(t, head, x, max_new_tokens=80, num_draft_tokens=2, eos_token_id=eos)
        else: out = mtpspec.generate(t, TreeDrafter(head, TreeConfig(costs=c)), x, max_new_tokens=80, num_draft_tokens=8, eos_token_id=eos)
        dt = time.perf_counter() - t0
        n = out.sequences.shape[1] - x.shape[1]
        tot[name][0] += n; tot[name][1] += out.stats.target_forwards - 1; tot[name][2] += dt
base = tot["chain"][0] / tot["chain"][2]
for k, (n, f, s) in tot.items():
    print(sys.argv[1], k, "%.1f tok/s  %.3fx chain  %.2f tok/fwd" % (n / s, n / s / base, n / f))
