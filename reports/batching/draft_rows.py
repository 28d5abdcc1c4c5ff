"""How many drafts pay under load: `Batch` in one process (no server), n requests kept running over
the built-in prompts (request i asks prompt i mod 24, as the load test does), greedy, up to 96 new
tokens each, the shipped head at k = 3, and `BatchConfig.draft_rows` shared among them (a request
drafts min(3, draft_rows // n - 1)). Aggregate tokens per second, forwards and rows per forward,
for each (blocks on AMX or not, n, draft_rows), one after another in this process; the embedded
SmolLM2 on its GGUF blocks (bf16). Nothing else should run.

    python reports/batching/draft_rows.py --n 1,8 --draft-rows 6,16,24,32 --amx both
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,8", help="requests kept running, comma-separated")
    ap.add_argument("--draft-rows", default="6,16,24,32", help="BatchConfig.draft_rows values, comma-separated")
    ap.add_argument("--amx", choices=("on", "off", "both"), default="both",
                    help="quantized matrices on AMX tiles (fused.amx_blocks) or AVX-512; 'on' needs a CPU with AMX")
    ap.add_argument("--requests", type=int, default=24, help="requests per configuration")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import mtpspec
    from mtpspec.config import SamplingConfig
    from mtpspec.core import fused
    from mtpspec.core.batch import Batch, BatchConfig
    from mtpspec.models import chat_ids, load_target
    from mtpspec.pretrained import resolve_head
    from mtpspec.prompts import load_prompts

    loaded = load_target(None, "auto", "auto")
    t = mtpspec.Target(loaded.model)
    head = resolve_head(t, loaded.name, None).head
    prompts = load_prompts(None, None)
    ids = [chat_ids(loaded.tokenizer, prompts[i % len(prompts)].text) for i in range(args.requests)]
    stop = [loaded.tokenizer.eos_token_id]
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.amx]
    print("| blocks on AMX | n | draft_rows | k each | tok/s | forwards | rows per forward |\n|---|---|---|---|---|---|---|")
    for on in modes:
        if fused.amx_blocks(on) != on:
            print(f"| {on} | (no AMX here: skipped) |")
            continue
        for n in (int(v) for v in args.n.split(",")):
            for dr in (int(v) for v in args.draft_rows.split(",")):
                batch = Batch(t, BatchConfig(max_rows=48, prefill_rows=16, draft_rows=dr))
                pending, tokens, steps, rows = list(ids)[::-1], 0, 0, 0
                start = time.perf_counter()
                while pending or len(batch):
                    while pending and len(batch) < n:
                        batch.add(pending.pop(), args.max_new_tokens, head, 3, SamplingConfig(), stop)
                    batch.step()
                    steps, rows = steps + 1, rows + batch.rows_last
                    for s in [s for s in batch.slots if s.done]:
                        tokens += len(s.state.new_tokens)
                        batch.remove(s)
                secs = time.perf_counter() - start
                print(f"| {on} | {n} | {dr} | {min(3, max(dr // n - 1, 0))} | {tokens / secs:.1f} | {steps} | "
                      f"{rows / steps:.1f} |", flush=True)
    fused.amx_blocks(False)


if __name__ == "__main__":
    main()
