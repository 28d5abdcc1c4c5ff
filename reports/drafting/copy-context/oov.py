"""Share of the target's greedy output tokens on Spec-Bench (48 evenly spread) that lie outside the
shipped head's draft vocabulary, per category."""
import json, collections, torch
torch.set_num_threads(1)
from safetensors.torch import load_file
from mtpspec.models import load_target, chat_ids
ld = load_target(None, "bf16")
ids = torch.zeros(49152, dtype=torch.bool)
ids[load_file("src/mtpspec/pretrained/smollm2-135m-instruct/mtp_head.safetensors")["draft_ids"]] = True
from mtpspec.prompts import load_prompts
qs = load_prompts("../shared/data/spec_bench/question.jsonl", limit=48)
by = collections.defaultdict(lambda: [0, 0])
cp = collections.Counter()
for q in qs:
    x = chat_ids(ld.tokenizer, q.text if hasattr(q, "text") else q.prompt)
    with torch.no_grad():
        out = ld.model.generate(x, max_new_tokens=64, do_sample=False)[0, x.shape[1]:]
    oov = ~ids[out]
    inprompt = torch.isin(out, x[0])
    by[q.category][0] += int(oov.sum()); by[q.category][1] += len(out); by[q.category].append(int((oov & inprompt).sum()))
tot = [sum(v[0] for v in by.values()), sum(v[1] for v in by.values())]
for c, v in sorted(by.items()):
    a, b, ip = v[0], v[1], sum(v[2:])
    print(f"{c:16s} {a / b:.3f} of {b}; of those in the prompt: {ip / max(a, 1):.2f}")
print(f"all {tot[0] / tot[1]:.3f} of {tot[1]}; in prompt {sum(sum(v[2:]) for v in by.values()) / tot[0]:.2f}")
