"""What one matmul of the fused forward costs by the rows it multiplies, on the embedded SmolLM2's
own GGUF matrices (Q4_1 layers, the Q8_0 embedding as the LM head), as multiply-adds per second,
beside torch's bf16 GEMM (oneDNN) on the same matrix dequantized: the rate this CPU reaches with a
GEMM that need not keep a row's result independent of the others. Median of `--repeats` calls,
nothing else running.

    python reports/batching/matmul_rows.py
    python reports/batching/matmul_rows.py --rows 1,8,16 --dtype q8     # 8-bit activations (VNNI)
"""

from __future__ import annotations

import argparse
import ctypes
import functools

import torch
import torch.nn.functional as F

MATRICES = {  # name: the HF parameter of layer 0 (or the LM head's table)
    "q (576 x 576)": "model.layers.0.self_attn.q_proj.weight",
    "gate (1536 x 576)": "model.layers.0.mlp.gate_proj.weight",
    "down (576 x 1536)": "model.layers.0.mlp.down_proj.weight",
    "LM head (49152 x 576, Q8_0)": "model.embed_tokens.weight",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,12,16,32,64")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "q8"), help="the fused matmul's arithmetic")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from mtpspec.core import fused, quant
    from mtpspec.measure.costs import median_time
    from mtpspec.models import load_target

    quantized = load_target(None, "bf16", "gguf").quantized
    so = fused._library(torch.bfloat16)[0]
    rows = [int(r) for r in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    print(f"fused matmul ({args.dtype}, {'AMX' if fused.uses_amx() else 'AVX-512'}) against torch bf16 "
          f"F.linear on the dequantized matrix, {args.threads} threads; GMAC/s (ms a call)")
    print("| matrix | rows | fused GMAC/s | torch GMAC/s | fused ms | fused ms a row |\n|---|---|---|---|---|---|")
    for name, key in MATRICES.items():
        q = quantized[key]
        part = fused.packed(q) if args.dtype == "q8" else q
        m = quant.mat([part], torch.bfloat16)
        O, I = q.shape  # noqa: E741
        dense = q.dequantize().to(torch.bfloat16)
        for R in rows:
            x = torch.randn(R, I, generator=g).to(torch.bfloat16)
            y = torch.empty(R, O)

            call = functools.partial(so.fused_qmatmul, x.data_ptr(), R, I, ctypes.addressof(m), O, y.data_ptr(), args.threads)
            t = median_time(call, args.repeats)
            tt = median_time(lambda x=x, w=dense: F.linear(x, w), args.repeats)
            macs = R * O * I / 1e9
            print(f"| {name} | {R} | {macs / t:.1f} | {macs / tt:.1f} | {t * 1e3:.3f} | {t * 1e3 / R:.3f} |", flush=True)


if __name__ == "__main__":
    main()
