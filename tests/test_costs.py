"""Choosing k from measured costs: the arithmetic, and a real (tiny) measurement; the memory
bandwidth and the bytes a forward reads, the limit set beside it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import tiny_model

from mtpspec import HeadConfig, MTPHead, Target
from mtpspec.errors import InputError
from mtpspec.measure import bandwidth
from mtpspec.measure.costs import Costs, expected_tokens, measure_costs, pick_k, predicted_speedup, predicted_speedups


def _costs(rel: dict[int, float], step: float = 0.02) -> Costs:
    return Costs(context=256, verify_s={n: r * 0.03 for n, r in rel.items()}, draft_step_s=step * 0.03,
                 dtype="float32", draft_vocab=8192)


def test_expected_tokens_is_one_plus_the_survival_sum():
    assert expected_tokens([1.0, 1.0, 1.0], 3) == 4.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.9, 0.0, 1.0], 3) == pytest.approx(1.9)


def test_predicted_speedup_is_expected_tokens_over_round_cost():
    # a round of k=2 costs verify(3) / verify(1) + 2 draft steps = 1.5 + 2 * 0.25 = 2.0 one-token forwards
    costs = _costs({1: 1.0, 2: 1.2, 3: 1.5}, step=0.25)
    assert predicted_speedup(costs, [0.5, 0.5], 2) == pytest.approx((1 + 0.5 + 0.25) / 2.0)
    assert predicted_speedups(costs, [0.5, 0.5, 0.5]) == pytest.approx({1: 1.5 / 1.45, 2: 1.75 / 2.0})  # no verify(4) timed


def test_pick_k_follows_the_cost_curve():
    acc = [0.8, 0.8, 0.8, 0.8, 0.8, 0.8]
    flat = _costs({n: 1.0 for n in range(1, 10)}, step=0.0)
    assert pick_k(flat, acc) == 6  # free verification and drafting: draft as far as trained
    steep = _costs({1: 1.0, 2: 1.09, 3: 1.18, 4: 1.59, 5: 1.7, 6: 1.8, 7: 1.9, 8: 2.0, 9: 2.1})
    k = pick_k(steep, acc)
    assert k == 2  # the jump at 4 tokens makes k = 3 worse than k = 2
    assert predicted_speedup(steep, acc, 2) > predicted_speedup(steep, acc, 3)
    assert pick_k(steep, [0.0] * 6) == 0  # a head that never hits: plain decoding


def test_measure_costs_runs_on_a_tiny_target():
    model = tiny_model("llama")
    c = measure_costs(Target(model), MTPHead.for_target(model), max_n=3, context=16, reps=2)
    assert set(c.verify_s) == {1, 2, 3} and all(v > 0 for v in c.verify_s.values()) and c.draft_step_s > 0
    assert c.draft_vocab == 97 and c.context == 16 and c.dtype == "float32"
    small = MTPHead.for_target(model, HeadConfig(draft_vocab_size=32), draft_ids=torch.arange(32))
    assert measure_costs(Target(model), small, max_n=1, context=8, reps=1).draft_vocab == 32


# -- the bandwidth limit ----------------------------------------------------------------------
def test_bandwidth_is_a_positive_finite_rate_with_either_kernel():
    kernels = ["torch"] + (["c"] if bandwidth._library()[0] is not None else [])
    for kernel in kernels:
        b = bandwidth.measure_bandwidth(1 << 20, passes=2, threads=1, kernel=kernel)
        assert b.kernel == kernel and b.buffer_bytes == 1 << 20 and b.passes == 2 and b.threads == 1
        assert 0 < b.bytes_per_s < math.inf and b.median_bytes_per_s <= b.bytes_per_s
    with pytest.raises(InputError, match="kernel must be one of"):
        bandwidth.measure_bandwidth(1 << 20, kernel="numpy")


def test_bytes_per_forward_are_the_weight_matrices_it_reads():
    model = tiny_model("llama")  # tied: the LM head is the embedding, counted once
    matrices = [p for p in model.parameters() if p.dim() == 2]
    assert bandwidth.forward_bytes(bandwidth.forward_matrices(Target(model))) == sum(p.nbytes for p in matrices)
    untied = tiny_model("llama", tie_word_embeddings=False)  # the embedding is gathered, not streamed
    expected = sum(p.nbytes for p in untied.parameters() if p.dim() == 2) - untied.model.embed_tokens.weight.nbytes
    assert bandwidth.forward_bytes(bandwidth.forward_matrices(Target(untied))) == expected


def test_a_quantized_matrix_counts_its_stored_blocks():
    QTensor = pytest.importorskip("mtpspec.core.quant").QTensor
    q8 = QTensor(qtype=8, shape=(4, 64), data=torch.zeros(4, 2 * 34, dtype=torch.uint8))  # Q8_0: 34 bytes per 32
    assert bandwidth.matrix_bytes(q8) == 4 * 2 * 34
    dense = torch.zeros(3, 64, dtype=torch.bfloat16)
    assert bandwidth.forward_bytes([q8, (q8, dense)]) == 2 * 4 * 2 * 34 + 3 * 64 * 2  # parts stacked as one matrix
    with pytest.raises(TypeError, match="not a weight matrix"):
        bandwidth.matrix_bytes("q8")


def test_the_limit_is_bytes_over_bandwidth_beside_the_measured_forward():
    bw = bandwidth.Bandwidth(bytes_per_s=20e9, median_bytes_per_s=18e9, buffer_bytes=1 << 30, passes=5, threads=2,
                             kernel="c")
    m = bandwidth.MemoryLimit(weight_bytes=270_000_000, bandwidth=bw, forward_s=0.0162)
    assert m.limit_s == pytest.approx(0.0135) and m.ratio == pytest.approx(1.2)
    d = m.to_dict()
    assert d["bandwidth_limit_ms"] == pytest.approx(13.5) and d["forward_over_limit"] == pytest.approx(1.2)
    assert "270.0 MB" in m.line() and "20.0 GB/s" in m.line() and "1.20x the limit" in m.line()


def test_measure_costs_sets_the_forward_beside_its_bandwidth_limit():
    model = tiny_model("llama")
    target = Target(model)
    c = measure_costs(target, MTPHead.for_target(model), max_n=1, context=8, reps=1, bandwidth_bytes=1 << 20)
    assert c.memory is not None and c.memory.forward_s == c.verify_s[1]
    assert c.memory.weight_bytes == sum(p.nbytes for p in model.parameters() if p.dim() == 2)
    assert 0 < c.memory.limit_s < math.inf and 0 < c.memory.ratio < math.inf
    assert measure_costs(target, MTPHead.for_target(model), max_n=1, context=8, reps=1).memory is None
    with pytest.raises(InputError, match="--bandwidth-mib must be >= 0"):
        measure_costs(target, MTPHead.for_target(model), max_n=1, context=8, reps=1, bandwidth_bytes=-1)


def test_a_gguf_targets_trees_are_priced_by_this_machines_costs_measured_once(tmp_path, monkeypatch):
    """On a GGUF file's blocks a verify row costs what dequantizing costs, which differs per CPU:
    the cost-shaped tree takes this machine's measured prices there (measured once, then read
    from the cache folder), and the constants elsewhere."""
    from test_quant_target import quantized_pair

    from mtpspec.core import fused
    from mtpspec.core.drafters import RoundCosts, build_drafter, head_round_costs
    from mtpspec.measure import costs as costs_mod

    if fused.reason(torch.bfloat16) is not None:
        pytest.skip(f"no fused bf16 forward here: {fused.reason(torch.bfloat16)}")
    monkeypatch.setenv("MTPSPEC_CACHE", str(tmp_path))
    dense, quantized = quantized_pair(3, torch.bfloat16)  # Q4_1
    assert head_round_costs(MTPHead.for_target(dense)) is None  # dense weights: the constants
    head = MTPHead.for_target(quantized)
    assert head.target.engine == "fused" and head.target.quantized
    measured = head_round_costs(head)  # its values are timings of this tiny model: only their form is checked
    assert isinstance(measured, RoundCosts) and min(measured.row, measured.plane, measured.step) >= 0
    files = list(tmp_path.glob("round-costs-*.json"))
    assert len(files) == 1 and RoundCosts(**json.loads(files[0].read_text())) == measured

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs_mod, "measure_costs", no_measuring)
    assert head_round_costs(head) == measured  # read back, not measured again
    tree, _ = build_drafter(head, "tree")
    assert tree.config.costs == measured
    hybrid, _ = build_drafter(head, "hybrid")
    assert hybrid.tree.config.costs == measured
