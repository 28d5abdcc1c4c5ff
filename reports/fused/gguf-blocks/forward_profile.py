"""Where a one-token forward on the GGUF blocks spends its time: each kind of matrix (all 30
layers' q/k/v, o, gate/up, down, then the LM head) timed alone through fused.c at R rows,
beside its bytes over this machine's streaming bandwidth; then the whole `Target.forward`
after 256 cached tokens. What the matmuls do not explain is the rest of the C forward (norms,
RoPE, attention, OpenMP barriers) and Python.

    python reports/fused/gguf-blocks/forward_profile.py [--rows R] [--dtype bf16|fp32|q8]
"""

from __future__ import annotations

import argparse
import ctypes

import torch

from mtpspec.core import fused, quant
from mtpspec.core.target import Target
from mtpspec.measure.bandwidth import matrix_bytes, measure_bandwidth
from mtpspec.measure.costs import median_time
from mtpspec.models import load_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--dtype", choices=("bf16", "fp32", "q8"), default="bf16")
    a = ap.parse_args()
    dt = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    torch.set_num_threads(2)
    t = Target(load_target(None, dtype=a.dtype, weights="gguf").model)
    so = fused._loaded(dt)[0]
    assert so is not None, fused.reason(dt)
    bw = measure_bandwidth()
    w = t.weights()
    kinds = {k: [getattr(layer, k) for layer in w.layers] for k in ("qkv", "o", "gate_up", "down")}
    kinds["lm_head"] = [w.lm_head]
    print(f"{a.dtype}, {a.rows} row(s), 2 threads; streaming bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s")
    total = limit = 0.0
    for name, projs in kinds.items():
        mats = [quant.mat(p.matrices, dt) for p in projs]
        I, O = int(projs[0].matrices[0].shape[1]), projs[0].out_features
        x, y = torch.randn(a.rows, I).to(dt), torch.empty(a.rows, O)

        def run(mats=mats, I=I, O=O, x=x, y=y) -> None:
            for m in mats:
                so.fused_qmatmul(x.data_ptr(), a.rows, I, ctypes.byref(m), O, y.data_ptr(), 2)

        s = median_time(run, 21)
        nb = sum(matrix_bytes(p.matrices) for p in projs)
        total, limit = total + s, limit + nb / bw.bytes_per_s
        kind = "/".join(sorted({getattr(m, "name", "dense") for m in projs[0].matrices}))
        print(f"  {name:8s} {kind:5s} x{len(projs):2d} ({O}x{I}): {s * 1e3:6.2f} ms, {nb / 1e6:5.1f} MB, "
              f"bandwidth limit {nb / bw.bytes_per_s * 1e3:5.2f} ms = {s / (nb / bw.bytes_per_s):.2f}x")
    print(f"  matmuls   {total * 1e3:6.2f} ms against a limit of {limit * 1e3:.2f} ms = {total / limit:.2f}x")
    ctx = 256
    ids = torch.randint(0, t.vocab_size, (1, ctx + a.rows), generator=torch.Generator().manual_seed(0))
    cache = t.new_cache(ctx + a.rows)
    t.forward(ids[:, :ctx], cache, (-1,), logits_to_keep=1)

    def forward() -> None:
        t.forward(ids[:, ctx:], cache, (-1,))
        cache.truncate(ctx)

    f = median_time(forward, 21)
    print(f"  Target.forward over {a.rows} token(s) after {ctx}: {f * 1e3:.2f} ms = {f / limit:.2f}x the limit; "
          f"{(f - total) * 1e3:.2f} ms beyond the matmuls")


if __name__ == "__main__":
    main()
