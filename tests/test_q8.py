"""8-bit activations (`--dtype q8`): a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks regrouped for VNNI
(`quant.pack`) and every matmul input quantized per row and per 32 inputs (fused.c: matmul_q8).

Properties:
- packing keeps every byte: `unpack(pack(q))` is `q`, and lookups read the same values;
- the matmul is the arithmetic it claims: against a numpy model of it (int8 activations rounded
  to nearest even, exact integer block sums, one fp32 chain per output);
- a pass over R rows equals R one-row passes (row invariance, 1..40 rows), whichever other parts
  share the matrix and whatever the AMX bits;
- a whole target on packed blocks: verify passes equal one-row passes, tree rows their paths,
  and speculative decoding equals its own plain decoding.
It is not the bf16 model: outputs only come close to the dense forward's (tested loosely).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import OracleDrafter, assert_tree_rows_equal_their_paths, assert_verify_passes_equal_one_row_passes, tiny_model
from test_quant import qmatmul, random_qtensor

import mtpspec
from mtpspec.core import fused
from mtpspec.core.qmodules import attach, dequantized_rows
from mtpspec.core.quant import NAMES, PACKED, QTensor, pack, unpack

TYPES = sorted(t & 0xFF for t in PACKED)
IDS = [NAMES[t] for t in TYPES]


@pytest.fixture(autouse=True)
def _needs_q8():
    if (why := fused.reason(torch.bfloat16)) is not None:
        pytest.skip(f"no fused bf16 forward here (8-bit activations run in it): {why}")


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
@pytest.mark.parametrize("rows", [16, 37])
def test_packing_keeps_every_byte_and_every_value(qtype, rows):
    q = random_qtensor(qtype, rows, 96, seed=rows)
    p = pack(q)
    assert torch.equal(fused.packed(q).data, p.data)  # in C: the same bytes
    assert p.nbytes == -(-rows // 16) * 16 * q.row_bytes  # the file's bytes, outputs padded to 16s
    assert torch.equal(unpack(p).data, q.data)
    ids = torch.tensor([0, rows - 1, 5, 5, rows // 2])
    assert torch.equal(dequantized_rows(p, ids, torch.bfloat16), dequantized_rows(q, ids, torch.bfloat16))
    assert torch.equal(p.take(ids).dequantize(), q.dequantize(ids))


def test_packing_refuses_a_type_it_has_no_kernel_for():
    with pytest.raises(ValueError, match="Q4_K"):
        pack(random_qtensor(12, 16, 256))


def reference(x: torch.Tensor, q: QTensor) -> np.ndarray:
    """y (R, O) as matmul_q8 computes it, in numpy (fp64 for the fused steps: close, not bitwise)."""
    xf = x.float().numpy().reshape(x.shape[0], -1, 32)  # (R, G, 32)
    amax = np.abs(xf).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    xq = np.rint((xf * inv[..., None]).astype(np.float32)).astype(np.int64)  # (R, G, 32)
    w = q.dequantize().numpy().astype(np.float64).reshape(q.shape[0], -1, 32)  # (O, G, 32): d_w * u + m_w
    # sum over blocks of d_x * (w . q): the same sum as d_w d_x (u . q) + m_w d_x (sum q)
    return np.einsum("rgk,ogk,rg->ro", xq.astype(np.float64), w, d.astype(np.float64))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_the_matmul_is_int8_activations_times_the_files_weights(qtype):
    q = random_qtensor(qtype, 40, 256, seed=qtype, std=0.1)
    x = (torch.randn(5, 256) * torch.linspace(0.1, 4, 256)).to(torch.bfloat16)
    x[3] = 0  # a zero row: scale 0, products 0
    got = qmatmul(x, [pack(q)], torch.bfloat16).numpy()
    want = reference(x, q)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert not got[3].any()
    # near the bf16 model's own product (activations quantized: about 1% of the output's size)
    dense = x.float() @ q.dequantize().T
    assert (torch.from_numpy(got) - dense).abs().max() <= 0.05 * dense.abs().max()


@pytest.mark.parametrize("amx", [0, fused.AMX_DENSE | fused.AMX_BLOCKS], ids=["avx512", "amx-bits"])
def test_a_pass_over_r_rows_equals_r_one_row_passes(amx):
    so, start, _ = fused._library(torch.bfloat16)
    parts = [pack(random_qtensor(3, 48, 192, seed=1)), pack(random_qtensor(8, 23, 192, seed=2)),
             random_qtensor(2, 32, 192, seed=3)]  # packed parts beside a plain one (its own kernel)
    x = torch.randn(40, 192).to(torch.bfloat16)
    so.fused_init(amx & start)
    try:
        one = torch.cat([qmatmul(x[i:i + 1], parts, torch.bfloat16) for i in range(40)])
        for R in (1, 2, 7, 8, 9, 16, 17, 40):
            assert torch.equal(qmatmul(x[:R], parts, torch.bfloat16), one[:R]), R
    finally:
        so.fused_init(start)


def packed_model(qtype: int):
    """(bf16 model on the file's blocks, the same on packed blocks): tiny llama, random blocks."""
    dense = tiny_model("llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2).to(torch.bfloat16)
    blocks = {}
    for i, (name, p) in enumerate(dense.named_parameters()):
        if p.dim() == 2:
            blocks[name] = random_qtensor(qtype, *p.shape, seed=i, std=0.5 if "embed" in name else 0.08)
    plain = attach(copy.deepcopy(dense), blocks, torch.bfloat16)
    return plain, attach(copy.deepcopy(dense), {k: pack(v) for k, v in blocks.items()}, torch.bfloat16)


@pytest.fixture(params=TYPES, ids=IDS)
def q8_pair(request):
    """(bf16 model on the file's blocks, the same blocks packed for 8-bit activations)"""
    return packed_model(request.param)


def test_a_packed_target_runs_fused_and_stays_near_the_bf16_one(q8_pair):
    plain, t = mtpspec.Target(q8_pair[0]), mtpspec.Target(q8_pair[1])
    assert t.engine == "fused" and t.dtype_name == "q8" and plain.dtype_name == "bfloat16"
    ids = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    a, b = plain.forward(ids, plain.new_cache(64)).logits, t.forward(ids, t.new_cache(64)).logits
    assert not torch.equal(a, b)  # not the bf16 model ...
    assert (a - b).abs().max() <= 0.1 * a.abs().max()  # ... but close to it


def test_a_verify_pass_of_1_to_40_rows_equals_one_row_passes(q8_pair):
    assert_verify_passes_equal_one_row_passes(mtpspec.Target(q8_pair[1]), (1, 2, 5, 8, 9, 16, 17, 40))


def test_a_tree_row_equals_decoding_its_path(q8_pair):
    assert_tree_rows_equal_their_paths(mtpspec.Target(q8_pair[1]))


def test_speculative_equals_plain_decoding_with_8bit_activations(q8_pair):
    t = mtpspec.Target(q8_pair[1])
    ids = torch.randint(4, 97, (1, 17), generator=torch.Generator().manual_seed(6))
    plain = mtpspec.generate(t, None, ids, max_new_tokens=32, num_draft_tokens=0, eos_token_id=[])
    for k in (1, 4):
        oracle = OracleDrafter(plain.sequences[0].tolist(), vocab=97, seed=k)
        out = mtpspec.generate(t, oracle, ids, max_new_tokens=32, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences), k


def test_q8_asks_for_a_gguf_target_and_says_so(tmp_path):
    from conftest import save_tiny_model_dir

    from mtpspec.errors import InputError
    from mtpspec.models import load_target

    save_tiny_model_dir(tmp_path / "m")
    with pytest.raises(InputError, match="GGUF file's quantized blocks"):
        load_target(str(tmp_path / "m"), dtype="q8")


def test_a_head_on_a_q8_target_drafts_from_blocks_and_keeps_the_output_exact(q8_pair):
    t = mtpspec.Target(q8_pair[1])
    head = mtpspec.MTPHead.for_target(t, mtpspec.HeadConfig(draft_vocab_size=48))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    fast = head.fused_step()
    assert fast is not None and bool(fast.struct.qfc) and bool(fast.struct.qwq)  # its own matrices as blocks
    ids = torch.randint(4, 97, (1, 15), generator=torch.Generator().manual_seed(9))
    plain = mtpspec.generate(t, None, ids, max_new_tokens=30, num_draft_tokens=0, eos_token_id=[])
    for tree in (False, True):
        out = mtpspec.generate(t, head, ids, max_new_tokens=30, num_draft_tokens=4, tree=tree, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences), tree


def test_q8_0_quantization_is_llama_cpps():
    from mtpspec.core.quant import quantize_q8_0

    w = torch.randn(20, 64)
    w[3, :32] = 0  # an all-zero block: scale 0
    q = quantize_q8_0(w)
    back = q.dequantize()
    d = w.reshape(20, 2, 32).abs().amax(-1, keepdim=True) / 127
    # half a step, plus 127 steps of d's rounding to fp16 (2^-11 relative)
    assert (back - w).abs().reshape(20, 2, 32).le(d * (0.5 + 127 * 2.0**-11) + 1e-7).all()
    assert not back[3, :32].any()


def test_a_q8_target_refuses_the_op_by_op_engine(q8_pair):
    """Op by op its modules would compute bf16 products: it says so instead of running."""
    from mtpspec.errors import InputError

    t = mtpspec.Target(q8_pair[1], engine="torch")
    with pytest.raises(InputError, match="q8 runs only in the fused forward"):
        t.forward(torch.tensor([[5, 6]]), t.new_cache(16))
