"""Greedy k0 outputs of the 24 built-in prompts (80 new tokens, bf16), written as JSON, so the
outputs of two commits or two weight choices can be compared token for token.

    python reports/fused/gguf-blocks/same_outputs.py OUT.json [dense|gguf]   # write (no weights arg: dense, any commit)
    python reports/fused/gguf-blocks/same_outputs.py --compare A.json B.json  # how many outputs are equal
"""

from __future__ import annotations

import json
import sys


def write(out: str, weights: str | None) -> None:
    import torch

    import mtpspec
    from mtpspec.models import chat_ids, load_target
    from mtpspec.prompts import load_prompts

    torch.set_num_threads(2)
    loaded = load_target(None, "bf16") if weights is None else load_target(None, "bf16", weights)
    target = mtpspec.Target(loaded.model)
    outs = {}
    for p in load_prompts(None):
        ids = chat_ids(loaded.tokenizer, p.text)
        seq = mtpspec.generate(target, None, ids, max_new_tokens=80, num_draft_tokens=0).sequences[0, ids.shape[1]:]
        outs[str(p.question_id)] = seq.tolist()
    with open(out, "w") as f:
        json.dump({"weights": weights or "dense", "outputs": outs}, f)


def compare(a: str, b: str) -> None:
    with open(a) as f:
        x = json.load(f)["outputs"]
    with open(b) as f:
        y = json.load(f)["outputs"]
    same = sum(x[k] == y.get(k) for k in x)
    print(f"{same}/{len(x)} outputs identical")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        write(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
