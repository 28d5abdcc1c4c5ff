"""The quality figures the bench reports for relaxed acceptance, each against a value worked out
another way: the target's mean log-probability against HF's own forward, edit distances drawn
by hand, the reference metrics on texts whose scores are known."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import mtpspec
from mtpspec.measure.quality import (
    QualityScorer,
    answer_match,
    chrf,
    contains_answer,
    edit_distance,
    final_number,
    mean_logprob,
    reference_score,
    rouge_l,
)
from mtpspec.prompts import Prompt


def test_mean_logprob_is_the_targets_own_teacher_forced_score():
    model = tiny_model("llama")
    target = mtpspec.Target(model)
    ids = torch.randint(4, 97, (1, 9), generator=torch.Generator().manual_seed(0))
    tokens = [5, 17, 40, 3, 88]
    logp = model(torch.cat([ids, torch.tensor([tokens])], 1)).logits[0, 8:-1].log_softmax(-1)
    want = float(logp[torch.arange(5), torch.tensor(tokens)].mean())
    assert mean_logprob(target, ids, tokens) == pytest.approx(want, abs=1e-4)
    assert mean_logprob(target, ids, []) is None
    greedy = mtpspec.generate(model, None, ids, max_new_tokens=5, eos_token_id=[]).sequences[0, 9:].tolist()
    assert mean_logprob(target, ids, greedy) > mean_logprob(target, ids, tokens)  # random tokens score lower


@pytest.mark.parametrize("a, b, d", [([], [], 0), ([1, 2, 3], [1, 2, 3], 0), ([1, 2, 3], [1, 3], 1),
                                     ([1, 2, 3], [3, 2, 1], 2), ([], [4, 5], 2), ([1, 2, 3, 4], [2, 3, 4, 5], 2)])
def test_edit_distance(a, b, d):
    assert edit_distance(a, b) == edit_distance(b, a) == d


def test_reference_metrics_on_known_texts():
    assert rouge_l("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(100.0)
    assert rouge_l("dogs bark", "the cat sat") == 0.0
    assert 0 < rouge_l("the cat was sitting", "the cat sat on the mat") < 100
    assert chrf("Pawnbrokers shine in Singapore", "Pawnbrokers shine in Singapore") == pytest.approx(100.0)
    assert chrf("zzz", "Pawnbrokers shine in Singapore") < 10
    assert final_number("So she pays 1,200 dollars.") == 1200 and final_number("#### 72\nmore 5") == 72
    assert final_number("no numbers") is None
    assert answer_match("The answer is 1000.", "400+600=1000\n#### 1000") == 100.0
    assert answer_match("The answer is 999.", "#### 1000") == 0.0
    rag = [["a source of lumber", "recreational areas"]]
    assert contains_answer("Forests are Recreational  areas, too.", rag) == 100.0
    assert contains_answer("Forests are green.", rag) == 0.0
    assert reference_score("summarization", "x", None) is None and reference_score("qa", "x", ["y"]) is None
    assert reference_score("translation", "a b", ["a b"])[0] == "chrF"


def test_the_scorer_runs_the_target_once_per_distinct_output():
    model = tiny_model("llama")
    calls = []
    target = mtpspec.Target(model)
    real = target.forward
    target.forward = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    scorer = QualityScorer(target, lambda ids: " ".join(f"w{i}" for i in ids))
    p = Prompt(1, "summarization", "w7", reference=["w5 w6"])
    ids = torch.tensor([[7, 8, 9]])
    first = scorer(p, ids, [5, 6])
    assert scorer(p, ids, [5, 6]) == first and len(calls) == 1
    assert first["rougeL"] == pytest.approx(100.0) and first["logprob"] < 0
    assert "rougeL" not in QualityScorer(target, str, references=False)(p, ids, [5, 6])
