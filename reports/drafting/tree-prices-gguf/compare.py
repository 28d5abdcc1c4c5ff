"""Cost-shaped trees on the GGUF file's blocks: the fused prices (FUSED_COSTS, measured on dense
bf16 weights) against this machine's own (`drafters.head_round_costs`, what `--tree` and hybrid
now use there), beside k0, the head's chain and switch, in one run.

    python reports/drafting/tree-prices-gguf/compare.py [--prompts FILE] [--limit 24] [--max-new-tokens 80]

Prints each method's tok/s over k0, tokens per verifying forward, and outputs identical to k0.
"""

from __future__ import annotations

import argparse

import torch

from mtpspec import Target
from mtpspec.core.drafters import (
    FUSED_COSTS,
    TREE_NODES,
    HybridDrafter,
    TreeConfig,
    TreeDrafter,
    build_drafter,
    head_round_costs,
)
from mtpspec.measure.bench import BenchConfig, mtpspec_method, run_bench
from mtpspec.models import chat_ids, load_target
from mtpspec.pretrained import resolve_head
from mtpspec.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=None, help="a prompts file (default: the built-in set)")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_target(None, "auto", "auto")
    target = Target(loaded.model)
    head = resolve_head(target, loaded.name).head
    measured = head_round_costs(head)  # measured once on this machine, then read from the cache folder
    print(f"engine {target.engine}, weights {loaded.weights}; fused prices {FUSED_COSTS}; measured here {measured}")
    n = args.max_new_tokens
    _, k = build_drafter(head, "chain")
    switch, ks = build_drafter(head, "switch")
    methods = [mtpspec_method("k0", target, None, 0, n), mtpspec_method("mtp", target, head, k, n),
               mtpspec_method("switch", target, head, ks, n, switch)]
    for label, costs in (("fused", FUSED_COSTS), ("measured", measured)):
        shape = TreeConfig(costs=costs)
        methods += [mtpspec_method(f"tree-{label}", target, head, TREE_NODES, n, TreeDrafter(head, shape)),
                    mtpspec_method(f"hybrid-{label}", target, head, TREE_NODES, n, HybridDrafter(head, shape, lookup_tokens=6))]
    prompts = load_prompts(args.prompts, args.limit)
    inputs = [chat_ids(loaded.tokenizer, p.text) for p in prompts]
    cfg = BenchConfig(methods=("k0", "mtp", "switch"), max_new_tokens=n)  # run_bench reads warm-up and reps from it
    result = run_bench(cfg, methods, prompts, inputs, progress=False)
    print("| method | x k0 | tokens per forward | ms per verify | identical to k0 |")
    print("|---|---|---|---|---|")
    for s in result.summaries:
        if s.category == "all":
            print(f"| {s.method} | {s.speedup_vs_k0:.2f}x | {s.mean_accepted or 1:.2f} | {s.ms_per_forward or 0:.2f} | "
                  f"{s.identical_k0}/{s.prompts} |")


if __name__ == "__main__":
    main()
