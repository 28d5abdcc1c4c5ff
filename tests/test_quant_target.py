"""A target computing on a GGUF file's quantized blocks (`quant.attach`, `load_target(...,
weights="gguf")`) against the same model holding the dequantized values densely, per block
type and compute dtype (bf16 on AMX tiles where present, and on AVX-512), through the fused forward:
- the same logits, features and cache, bit for bit;
- a verify pass of 1..40 rows equals one-row passes; a tree row equals decoding its path;
- speculative decoding equals plain decoding.
Tiny llama models whose every matrix is random blocks (K-quants need inputs in blocks of 256)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    KERNELS,
    OracleDrafter,
    assert_tree_rows_equal_their_paths,
    assert_verify_passes_equal_one_row_passes,
    kernel_dtype,
    tiny_model,
)
from test_quant import random_qtensor

import mtpspec
from mtpspec.core import fused
from mtpspec.core.qmodules import QuantEmbedding, QuantLinear, attach
from mtpspec.core.quant import NAMES

TYPES = [2, 3, 8, 12, 13, 14]


def quantized_pair(qtype: int, dtype: torch.dtype):
    """(dense model, quantized model): the same random blocks, dequantized into the first."""
    wide = qtype >= 12
    dims = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2) if wide else \
        dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    dense = tiny_model("llama", **dims).to(dtype)
    quantized = {}
    for i, (name, p) in enumerate(dense.named_parameters()):
        if p.dim() == 2:
            q = random_qtensor(qtype, *p.shape, seed=i, std=0.5 if "embed" in name else 0.08)
            quantized[name] = q
            p.data = q.dequantize().to(dtype)  # the tied LM head follows the embedding
    return dense, attach(copy.deepcopy(dense), quantized, dtype)


@pytest.fixture(params=KERNELS)
def dtype(request):
    """bf16 on the AMX tiles where the CPU has them (dense and quantized matrices alike: AMX_BLOCKS)
    and on AVX-512 dot products, and fp32; the fixture's value is the dtype. (A process's default
    AMX bits put dense matrices on the tiles and quantized ones on AVX-512: there the two models
    would differ in the order of their sums.)"""
    yield from kernel_dtype(request.param, fused.AMX_DENSE | fused.AMX_BLOCKS)


@pytest.fixture(params=TYPES, ids=[NAMES[t] for t in TYPES])
def pair(request, dtype):
    return quantized_pair(request.param, dtype)


def test_attach_swaps_every_matrix_for_blocks_and_keeps_no_dense_copy(pair):
    _, q = pair
    assert isinstance(q.model.embed_tokens, QuantEmbedding) and isinstance(q.lm_head, QuantLinear)
    assert q.lm_head.qweight is q.model.embed_tokens.qweight  # tied, as the dense model was
    assert not any(p.dim() == 2 for p in q.parameters())
    t = mtpspec.Target(q)
    assert t.quantized and t.engine == "fused"


def test_the_quantized_target_computes_what_the_dense_one_computes(pair):
    dense, quant = (mtpspec.Target(m) for m in pair)
    assert dense.identity() == quant.identity()  # a head trained on the dense model fits
    ids = torch.randint(4, 97, (1, 23), generator=torch.Generator().manual_seed(1))
    cd, cq = dense.new_cache(64), quant.new_cache(64)
    a, b = dense.forward(ids, cd, hidden_layers=(-2, -1)), quant.forward(ids, cq, hidden_layers=(-2, -1))
    assert torch.isfinite(a.logits).all()
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    assert torch.equal(cd.keys, cq.keys) and torch.equal(cd.values, cq.values)


def test_a_verify_pass_of_1_to_72_rows_equals_one_row_passes(pair):
    """Every way the AMX kernel holds its sums: up to 16 rows (one column block, 4 tiles a block),
    17-32 (two column blocks, 2 tiles a block), 33-64 (three or four, 1 tile a block), beyond 64
    (the sums stored between chunks of inputs)."""
    assert_verify_passes_equal_one_row_passes(mtpspec.Target(pair[1]), (1, 2, 5, 9, 16, 17, 24, 32, 33, 40, 48, 49,
                                                                          64, 65, 72))


def test_a_tree_row_equals_decoding_its_path(pair):
    assert_tree_rows_equal_their_paths(mtpspec.Target(pair[1]))


def test_speculative_equals_plain_decoding_on_quantized_weights(pair):
    dense, quant = pair
    ids = torch.randint(4, 97, (1, 17), generator=torch.Generator().manual_seed(6))
    plain = mtpspec.generate(quant, None, ids, max_new_tokens=32, num_draft_tokens=0, eos_token_id=[])
    assert torch.equal(plain.sequences, mtpspec.generate(dense, None, ids, max_new_tokens=32, num_draft_tokens=0,
                                                         eos_token_id=[]).sequences)
    for k in (1, 4):
        oracle = OracleDrafter(plain.sequences[0].tolist(), vocab=97, seed=k)
        out = mtpspec.generate(quant, oracle, ids, max_new_tokens=32, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences), k


def test_matmuls_names_the_arithmetic_in_use(dtype):
    """What a data set records of how its target's matrices were computed: the tiles where the
    fixture put dense and quantized matrices on them, dot products elsewhere, PyTorch for a
    target the fused forward does not take."""
    _, quantized = quantized_pair(2, dtype)
    target = mtpspec.Target(quantized)
    amx = dtype == torch.bfloat16 and fused._library(dtype)[0].fused_amx()
    assert fused.matmuls(target) == ("amx" if amx else "avx512")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fused, "unsupported", lambda t: "not here")
        assert fused.matmuls(target) == "torch"


def test_the_op_by_op_modules_dequantize_to_the_same_values():
    dense, quant = quantized_pair(3, torch.float32)
    h = torch.randn(2, 128)
    assert torch.equal(quant.model.layers[0].mlp.down_proj(h), dense.model.layers[0].mlp.down_proj(h))
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(quant.model.embed_tokens(ids), dense.model.embed_tokens(ids))


def test_attach_refuses_a_module_it_cannot_replace():
    model = tiny_model("llama")
    q = random_qtensor(3, 32, 32)
    with pytest.raises(ValueError, match="only nn.Linear and nn.Embedding"):
        attach(model, {"model.layers.0.input_layernorm.weight": q}, torch.float32)
