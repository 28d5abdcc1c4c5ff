"""What a batched forward costs on this machine: the fused forward over n sequences of r rows each
(every sequence with its own cache of `--context` committed positions), and the MTP head drafting
k tokens for n requests at once (`MTPHead.propose_many`) against one after another. Median of
`--repeats` runs each, nothing else running; the embedded SmolLM2 on its GGUF blocks (bf16).
Where the CPU has AMX, each forward is timed with the quantized matrices on the AMX tiles
(`fused.amx_blocks(True)`, what `mtpspec serve` uses there) and on AVX-512 dot products (the
default), interleaved in this one process (the two kernels' outputs differ in the order of fp32
sums; each is exact on its own).

    python reports/batching/forward_rows.py
    python reports/batching/forward_rows.py --context 8,200,600 --shapes 1x1,16x1,64x1 --no-head   # rows x context
    python reports/batching/forward_rows.py --dtype q8 --no-head   # 8-bit activations (VNNI dot products)
    python reports/batching/forward_rows.py --weights dense --no-head   # the blocks widened to bf16 at load
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", default="200", help="committed positions in each sequence's cache (a comma list: "
                    "one table each)")
    ap.add_argument("--shapes", default="1x1,1x4,1x16,2x1,4x1,8x1,16x1,2x4,4x4,8x4,12x4,16x3,16x4",
                    help="sequences x rows each, comma separated")
    ap.add_argument("--no-head", action="store_true", help="skip the head's drafting table")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="the target's dtype, as `mtpspec --dtype` (auto, bf16, q8, fp32)")
    ap.add_argument("--weights", default="auto", choices=["auto", "gguf", "dense"],
                    help="compute on the file's blocks (gguf) or on bf16 matrices widened from them at load (dense)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import mtpspec
    from mtpspec.config import SamplingConfig
    from mtpspec.core import fused
    from mtpspec.core.draft import DraftInput
    from mtpspec.core.fused import SeqRows
    from mtpspec.measure.costs import median_time
    from mtpspec.models import load_target
    from mtpspec.pretrained import resolve_head

    loaded = load_target(None, args.dtype, args.weights)
    t = mtpspec.Target(loaded.model)
    head = resolve_head(t, loaded.name, None).head
    g = torch.Generator().manual_seed(0)
    shapes = [tuple(int(v) for v in x.split("x")) for x in args.shapes.split(",")]
    contexts = [int(c) for c in args.context.split(",")]
    caches = [t.new_cache(max(contexts) + 128) for _ in range(max(n for n, _ in shapes + [(16, 1)]))]
    amx = fused.uses_amx()

    def timed(fn) -> str:
        """fn's median time in ms: blocks on AMX and on AVX-512 (and their ratio) where there is AMX."""
        if not amx:
            return f"{median_time(fn, args.repeats) * 1000:.2f}"
        ms: dict[bool, list[float]] = {}
        for _ in range(2):  # interleaved: AMX, AVX-512, AMX, AVX-512
            for on in (True, False):
                fused.amx_blocks(on)
                ms.setdefault(on, []).append(median_time(fn, args.repeats) * 1000)
        fused.amx_blocks(False)
        a, b = min(ms[True]), min(ms[False])
        return f"{a:.2f} | {b:.2f} | {b / a:.2f}x"

    for L in contexts:
        for c in caches:  # each sequence's own L committed positions
            c.length = 0
            t.forward(torch.randint(0, t.vocab_size, (1, L), generator=g), c)
        print(f"fused forward, {L} positions of context each ({t.engine}, {t.dtype}, {args.threads} threads)")
        cols = "blocks on AMX ms | on AVX-512 ms | AVX-512 / AMX" if amx else "ms"
        print(f"| sequences | rows each | rows | {cols} |\n|---|---|---|{'---|' * (3 if amx else 1)}")
        for n, r in shapes:
            ids = [torch.randint(0, t.vocab_size, (1, r), generator=g) for _ in range(n)]

            def run(n: int = n, ids: list = ids, L: int = L) -> None:
                for c in caches[:n]:
                    c.length = L
                t.forward_many([SeqRows(i, c) for i, c in zip(ids, caches[:n])])
            print(f"| {n} | {r} | {n * r} | {timed(run)} |", flush=True)
        print()
    if args.no_head:
        return
    L = contexts[-1]
    for c in caches:
        c.length = L
    tokens = torch.randint(0, t.vocab_size, (1, L + 1), generator=g)
    greedy = SamplingConfig()
    print("head drafts, k = 3 each\n| requests | together ms | one by one ms |\n|---|---|---|")
    for n in (1, 4, 8, 16):
        inps = [DraftInput(tokens, torch.randn(1, t.hidden_size, generator=g).to(t.dtype), caches[i]) for i in range(n)]
        together = median_time(lambda inps=inps, n=n: head.propose_many(inps, [3] * n, [greedy] * n, [None] * n),
                               args.repeats)
        alone = median_time(lambda inps=inps: [head.propose(i, 3, greedy, None) for i in inps], args.repeats)
        print(f"| {n} | {together * 1000:.2f} | {alone * 1000:.2f} |", flush=True)


if __name__ == "__main__":
    main()
