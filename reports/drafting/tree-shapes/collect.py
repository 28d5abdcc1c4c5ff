"""Collect, at every position of the greedy output, the head's ranked tree candidates, and the
greedy continuation, so that draft shapes can be simulated offline (greedy acceptance of any
subtree = its longest path matching the continuation)."""
import pickle
import sys

import torch

from mtpspec.core.decode import generate
from mtpspec.core.draft import DraftInput
from mtpspec.core.drafters import TreeConfig, TreeDrafter
from mtpspec.core.target import Target
from mtpspec.models import chat_ids, load_target
from mtpspec.pretrained import resolve_head
from mtpspec.prompts import load_prompts

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
path = None if sys.argv[1] == "builtin" else sys.argv[1]
limit = None if path is None else 48
loaded = load_target(None, "bf16")
tgt = Target(loaded.model)
head = resolve_head(tgt, loaded.name, sys.argv[4] if len(sys.argv) > 4 else None).head  # argv[4]: a head dir
prompts = load_prompts(path, limit)
drafter = TreeDrafter(head, TreeConfig(width=4, beam=4, max_depth=6))
rows = []
for p in prompts:
    ids = chat_ids(loaded.tokenizer, p.text)
    out = generate(tgt, head, ids, max_new_tokens=80, num_draft_tokens=4).sequences
    T = ids.shape[1]
    seq = out[0].tolist()
    cache = tgt.new_cache(len(seq) + 80)
    st = tgt.forward(out, cache, head.hidden_layers)
    per = []
    for L in range(T, len(seq) - 1):  # cache holds 0..L-1, token L emitted
        cache.length = L
        inp = DraftInput(out[:, :L + 1], st.hidden[:, L - 1], cache)
        nodes = drafter.ranked_nodes(inp, 24)
        per.append([(n.token, n.parent, n.score) for n in nodes])
    rows.append(dict(category=p.category, T=T, seq=seq, nodes=per))
    print(p.category, len(seq) - T, flush=True)
pickle.dump(rows, open(sys.argv[2], "wb"))
