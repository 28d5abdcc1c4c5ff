"""Acceptance of the shipped head with and without the context tokens added to its draft vocabulary."""
import sys, torch
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
from mtpspec.models import load_target, chat_ids
from mtpspec.core.target import Target
from mtpspec.pretrained import resolve_head
from mtpspec.prompts import load_prompts
from mtpspec.measure.acceptance import measure_acceptance, markdown
which, k = sys.argv[1], int(sys.argv[2])
plist = load_prompts(None if which == "builtin" else "../shared/data/spec_bench/question.jsonl", None if which == "builtin" else 48)
ld = load_target(None, "bf16")
tgt = Target(ld.model)
head = resolve_head(tgt, ld.name, None, warn=print).head
inputs = [chat_ids(ld.tokenizer, p.text) for p in plist]
for copy in (True, False):
    head.copy_context = copy
    rows = measure_acceptance(tgt, head, plist, inputs, [k], [0.0], 64, 1.0, 0)
    print(f"== {which} k={k} copy_context={copy}")
    print(markdown(rows), flush=True)
