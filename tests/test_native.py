"""mtpspec's own C kernels (`core/native.py`, `core/rowdot.c`): close to torch's results, and
row-invariant by construction - a row's bits never depend on the other rows in the call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mtpspec.core import kernels, native

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"native kernels unavailable: {native.reason()}")


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_out, n_in", [(64, 32), (97, 45), (3, 8), (960, 576), (7, 1536)])
def test_rowdot_is_a_matmul_whose_rows_do_not_depend_on_each_other(n_out, n_in, dtype):
    w, x = _rand(n_out, n_in, seed=n_out).to(dtype), _rand(16, n_in, seed=n_in).to(dtype)
    alone = [native.rowdot(x[i:i + 1], w) for i in range(16)]
    exact = x.double() @ w.double().T  # bf16 operands widen exactly: only the fp32 sums round
    torch.testing.assert_close(torch.cat(alone).double(), exact, rtol=1e-5 if dtype == torch.float32 else 8e-3, atol=1e-4)
    if dtype == torch.bfloat16:  # rounded once, to nearest even, as torch rounds fp32 to bf16
        assert torch.equal(torch.cat(alone), native.rowdot(x, w, fp32_out=True).to(dtype))
    for R in range(2, 17):
        together = native.rowdot(x[:R], w)
        for i in range(R):
            assert torch.equal(together[i:i + 1], alone[i]), (R, i)
    # batched: each batch element as if alone
    xb, wb = _rand(3, 5, n_in, seed=1).to(dtype), _rand(3, n_out, n_in, seed=2).to(dtype)
    yb = native.rowdot(xb, wb)
    assert all(torch.equal(yb[b], native.rowdot(xb[b], wb[b])) for b in range(3))


def test_rowdot_gives_the_same_bits_for_any_thread_count():
    w, x = _rand(301, 200, seed=3), _rand(5, 200, seed=4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.rowdot(x, w)
        torch.set_num_threads(2)
        assert torch.equal(native.rowdot(x, w), one)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mix_is_a_weighted_sum_whose_rows_do_not_depend_on_each_other(dtype):
    p = torch.rand(2, 12, 70, generator=torch.Generator().manual_seed(5))
    p[:, :, 50:] = 0  # masked slots: skipped, exactly as a zero weight adds nothing
    v = _rand(2, 70, 64, seed=6).to(dtype)
    out = native.mix(p, v)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), p @ v.float(), rtol=1e-5 if dtype == torch.float32 else 8e-3, atol=1e-4)
    for i in range(12):
        assert torch.equal(native.mix(p[:, i:i + 1], v), out[:, i:i + 1])
    with pytest.raises(ValueError, match="multiple of 8"):
        native.mix(p, v[..., :60])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 20.0])
def test_rowdot_attention_is_attention_and_row_invariant(softcap, dtype):
    for S in kernels.CHECK_SLOTS:
        ok, _ = kernels._check_attention("rowdot", dtype, 9, 3, 64, S, softcap)
        assert ok, S
    q, k, v = (_rand(1, n, t, 16, seed=s).to(dtype) for n, t, s in ((4, 6, 7), (2, 40, 8), (2, 40, 9)))
    mask = torch.arange(40)[None, :] <= torch.arange(30, 36)[:, None]
    ours = kernels.attention(q, k, v, mask, 0.25, "rowdot", softcap)
    ref = kernels.attention(q.float(), k.float(), v.float(), mask, 0.25, "manual", softcap)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours.float(), ref, rtol=tol, atol=tol)


def test_native_kernels_refuse_what_they_cannot_compute():
    with pytest.raises(ValueError, match="fp32 or bf16 CPU"):
        native.rowdot(_rand(2, 8, seed=0).half(), _rand(4, 8, seed=0).half())
    with pytest.raises(ValueError, match="all torch.float32"):
        native.rowdot(_rand(2, 8, seed=0), _rand(4, 8, seed=0).bfloat16())


@pytest.mark.slow
def test_plans_with_native_kernels_are_row_invariant_and_without_them_never_offer_them(tmp_path):
    for dtype in native.DTYPES:
        plan = kernels.choose_plan(dtype, {(64, 32): 2, (97, 32): 1}, (4, 2, 16), 2, use_cache=False)
        assert plan.row_invariant, (dtype, plan)
    env = {**os.environ, "MTPSPEC_NATIVE": "0", "MTPSPEC_CACHE": str(tmp_path)}
    code = ("import torch; from mtpspec.core import kernels, native; "
            "p = kernels.choose_plan(torch.float32, {(64, 32): 2}, (4, 2, 16), 2, use_cache=False); "
            "print(native.reason(), p.linear, p.attention)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "MTPSPEC_NATIVE=0" in out and "rowdot" not in out, out
