"""q8 against bf16 on the embedded target (both on the GGUF blocks): greedy k0 texts of the 24 built-in
prompts (80 tokens) compared, and the last prompt position's logits of 8 of them.

    python reports/fused/q8/q8_vs_bf16.py
"""

from __future__ import annotations

import torch

import mtpspec
from mtpspec.models import chat_ids, load_target
from mtpspec.prompts import load_prompts


def main() -> None:
    outs, rel = {}, []
    torch.set_num_threads(2)
    prompts = load_prompts(None, None)
    for dt in ("bf16", "q8"):
        loaded = load_target(None, dtype=dt, weights="gguf")
        t = mtpspec.Target(loaded.model)
        outs[dt] = []
        for p in prompts:
            ids = chat_ids(loaded.tokenizer, p.text)
            g = mtpspec.generate(t, None, ids, max_new_tokens=80, num_draft_tokens=0)
            outs[dt].append(g.sequences[0, ids.shape[1]:].tolist())
        if dt == "bf16":
            ref = [t.forward(chat_ids(loaded.tokenizer, p.text), t.new_cache(512)).logits[0, -1] for p in prompts[:8]]
        else:
            for p, r in zip(prompts[:8], ref):
                z = t.forward(chat_ids(loaded.tokenizer, p.text), t.new_cache(512)).logits[0, -1]
                rel.append(float((z - r).abs().max() / r.abs().max()))
    same = sum(a == b for a, b in zip(outs["bf16"], outs["q8"]))
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(outs["bf16"], outs["q8"])]
    print(f"greedy 80 tokens: q8 == bf16 on {same}/{len(prompts)} prompts; first differing token (median) {sorted(first)[len(first)//2]}")
    print("last-position logits, max |q8 - bf16| / max |bf16|, 8 prompts: " + ", ".join(f"{x:.3f}" for x in rel))


if __name__ == "__main__":
    main()
