"""The fused forward's quantized matmul (fused.c: qdot_block) against the dense one.

Properties, for every GGUF block type the kernels read and both compute dtypes:
- each weight it multiplies is exactly gguf-py's dequantized value (rounded to bf16 in bf16):
  identity rows read the weights back bit for bit;
- on any input it gives bit for bit what the dense kernel gives on the dequantized matrix;
- a pass over R rows equals R one-row passes (row invariance, 1..16 rows), so speculative
  decoding on quantized weights stays equal to plain decoding.
Random blocks (random quants and scales) cover every bit pattern the layouts can hold.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from conftest import KERNELS, kernel_dtype

from mtpspec.core import fused
from mtpspec.core.quant import BLOCKS, NAMES, QTensor, mat

# byte offsets of each type's fp16 scale fields inside a block
SCALES = {2: (0,), 3: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_qtensor(qtype: int, rows: int, inputs: int, seed: int = 0, std: float | None = None) -> QTensor:
    """(O, I) of random blocks of `qtype`, with finite random fp16 scales; `std`: scales drawn
    so that the dequantized weights have about that standard deviation."""
    O, I = rows, inputs  # noqa: E741 (the module's letters)
    n, b = BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(O, I // n, b), dtype=np.uint8)
    scales = rng.standard_normal((len(SCALES[qtype]), O, I // n))
    for size in (0.02, None):  # once at a unit size, then at the size that gives `std`
        if size is None:
            if std is None:
                break
            size = 0.02 * std / float(QTensor(qtype, (O, I), torch.from_numpy(raw.reshape(O, -1).copy())).dequantize().std())
        for i, off in enumerate(SCALES[qtype]):
            raw[:, :, off:off + 2] = (scales[i] * size).astype(np.float16).view(np.uint8).reshape(O, I // n, 2)
    return QTensor(qtype, (O, I), torch.from_numpy(raw.reshape(O, -1).copy()))


def qmatmul(x: torch.Tensor, parts: list, dtype: torch.dtype) -> torch.Tensor:
    so = fused._library(dtype)[0]
    m = mat(parts, dtype)
    O = sum(int(p.shape[0]) for p in parts)  # noqa: E741
    y = torch.empty(x.shape[0], O)
    so.fused_qmatmul(x.data_ptr(), x.shape[0], x.shape[1], ctypes.addressof(m), O, y.data_ptr(), torch.get_num_threads())
    return y


def dense_matmul(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    so = fused._library(dtype)[0]
    y = torch.empty(x.shape[0], w.shape[0])
    so.fused_matmul(x.data_ptr(), x.shape[0], x.shape[1], w.data_ptr(), w.shape[0], y.data_ptr(), torch.get_num_threads())
    return y


@pytest.fixture(params=KERNELS)
def dtype(request):
    """bf16 on AMX tiles (quantized matrices too, AMX_BLOCKS) where the CPU has them, bf16 on
    AVX-512 dot products, fp32."""
    yield from kernel_dtype(request.param, fused.AMX_DENSE | fused.AMX_BLOCKS)


@pytest.mark.parametrize("qtype", sorted(BLOCKS), ids=[NAMES[t] for t in sorted(BLOCKS)])
def test_identity_rows_read_back_gguf_pys_values(qtype, dtype):
    q = random_qtensor(qtype, 12, 256, seed=qtype)
    eye = torch.eye(256, dtype=dtype)
    got = qmatmul(eye, [q], dtype)  # (I, O): row i = column i of the weights
    want = q.dequantize().to(dtype).float()
    assert torch.equal(got.T, want)


@pytest.mark.parametrize("qtype", sorted(BLOCKS), ids=[NAMES[t] for t in sorted(BLOCKS)])
def test_quantized_equals_dense_on_the_dequantized_weights_for_any_row_count(qtype, dtype):
    O, I = 37, 512  # noqa: E741 (O not a multiple of 4: a partial block of outputs)
    q = random_qtensor(qtype, O, I, seed=100 + qtype)
    w = q.dequantize().to(dtype).contiguous()
    x = torch.randn(16, I).to(dtype)
    alone = torch.cat([qmatmul(x[r:r + 1], [q], dtype) for r in range(16)])
    for R in (1, 2, 3, 5, 7, 9, 16):
        got = qmatmul(x[:R].contiguous(), [q], dtype)
        assert torch.equal(got, dense_matmul(x[:R].contiguous(), w, dtype)), f"{R} rows"
        assert torch.equal(got, alone[:R]), f"{R} rows differ from one-row passes"


def test_parts_of_mixed_types_stack_along_the_outputs(dtype):
    # q, k, v as a GGUF file may store them: different types, one matrix
    I = 256  # noqa: E741
    parts = [random_qtensor(12, 16, I, 1), random_qtensor(14, 8, I, 2), torch.randn(6, I).to(dtype)]
    x = torch.randn(3, I).to(dtype)
    want = torch.cat([dense_matmul(x, p.dequantize().to(dtype).contiguous() if isinstance(p, QTensor) else p, dtype)
                      for p in parts], 1)
    assert torch.equal(qmatmul(x, parts, dtype), want)


def test_a_matrix_refuses_what_it_cannot_describe():
    q = random_qtensor(3, 4, 64)
    with pytest.raises(ValueError, match="input width"):
        mat([q, random_qtensor(3, 4, 96)], torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous 2-D"):
        mat([torch.zeros(4, 64)], torch.bfloat16)
    with pytest.raises(ValueError, match="whole blocks"):
        QTensor(3, (4, 40), torch.zeros(4, 25, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not one the quantized kernels read"):
        QTensor(1, (4, 64), torch.zeros(4, 128, dtype=torch.uint8))


@pytest.mark.parametrize("qtype", sorted(BLOCKS), ids=[NAMES[t] for t in sorted(BLOCKS)])
def test_an_embedding_lookup_reads_the_dense_tables_values(qtype, dtype):
    q = random_qtensor(qtype, 50, 256, seed=7 + qtype)
    ids = torch.tensor([3, 0, 49, 3, 17])
    assert torch.equal(fused.quantized_rows(q, ids, dtype), q.dequantize().to(dtype)[ids])
    with pytest.raises(IndexError, match="token ids"):
        fused.quantized_rows(q, torch.tensor([50]), dtype)
