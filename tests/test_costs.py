"""Choosing k from measured costs: the arithmetic, and a real (tiny) measurement."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from mtpspec import HeadConfig, MTPHead, Target
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
