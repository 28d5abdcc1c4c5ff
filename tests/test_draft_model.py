"""An independent draft model in mtpspec's loop (`core/draft_model.py`): greedy output is plain
decoding's token for token whatever the draft model proposes; its own KV cache, rolled back with
the target's after every round, always holds exactly what a fresh prefill of the accepted text
computes; a draft model with another vocabulary is refused with a message that says why."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import hf_greedy, tiny_model

import mtpspec
from mtpspec import SamplingConfig, Target
from mtpspec.core.decode import prefill, step
from mtpspec.core.draft_model import DraftModelDrafter
from mtpspec.errors import InputError

PROMPT = torch.tensor([[5, 17, 42, 8, 9, 30]])


def perturbed_copy(model, scale: float, seed: int = 1):
    """The target with noise on every weight: it agrees with the target often but not always,
    so rounds accept every number of drafts from none to all."""
    torch.manual_seed(seed)
    dm = copy.deepcopy(model)
    with torch.no_grad():
        for p in dm.parameters():
            p.add_(torch.randn_like(p) * scale)
    return dm


def drafters(model):
    """Copies of the target, exact (every draft accepted) to far (most rejected), and an
    unrelated small LM of another shape (its own embedding table, one layer)."""
    target = Target(model)
    other = tiny_model("llama", seed=3, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)
    copies = {name: DraftModelDrafter(perturbed_copy(model, scale), target)
              for name, scale in (("copy", 0.0), ("near", 0.005), ("mid", 0.01), ("far", 0.3))}
    return {**copies, "other": DraftModelDrafter(other, target)}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_a_draft_model_equals_plain_decoding(family, k):
    model = tiny_model(family)
    plain = mtpspec.generate(model, None, PROMPT, max_new_tokens=60, num_draft_tokens=0, eos_token_id=[]).sequences
    assert torch.equal(plain, hf_greedy(model, PROMPT, 60, eos=[]))
    hist = [0] * (k + 1)
    for name, drafter in drafters(model).items():
        out = mtpspec.generate(model, drafter, PROMPT, max_new_tokens=60, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, plain), name
        hist = [a + b for a, b in zip(hist, out.stats.accept_hist)]
    # none, all, and (k > 1) some of a round's drafts were accepted: every kind of rollback ran
    assert hist[0] and hist[k] and (k == 1 or any(hist[1:k])), hist


@pytest.mark.parametrize("k", [1, 2, 4])
def test_after_every_round_its_cache_is_a_fresh_prefill_of_the_accepted_text(k):
    model = tiny_model("llama")
    target = Target(model)
    for drafter in drafters(model).values():
        state, _ = prefill(target, PROMPT, max_new_tokens=48, eos_token_id=[])
        while not state.done:
            step(target, drafter, state, k)
            text = state.tokens[0].tolist()
            C = len(drafter.ids)
            # a prefix of the text: at most one accepted draft and the target's own token unseen (the
            # last round, with one token left to emit, drafts nothing and leaves the drafter alone)
            assert drafter.ids == text[:C] and (state.done or len(text) - 2 <= C <= len(text) - 1)
            assert drafter.cache.length == C
            fresh = drafter.lm.new_cache(drafter.cache.capacity)  # same slots: the same attention lengths
            drafter.lm.forward(torch.tensor([drafter.ids]), fresh)
            for got, want in ((drafter.cache.keys, fresh.keys), (drafter.cache.values, fresh.values)):
                torch.testing.assert_close(got[:, :, :C], want[:, :, :C], rtol=0, atol=1e-5)


def test_a_new_prompt_is_prefilled_afresh_and_a_prefill_is_reused():
    model = tiny_model("llama")
    drafter = drafters(model)["near"]
    first = mtpspec.generate(model, drafter, PROMPT, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    other = torch.tensor([[7, 7, 19]])
    drafter.prefill(other)
    assert drafter.ids == other[0].tolist() and drafter.cache.length == 3
    second = mtpspec.generate(model, drafter, other, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    again = mtpspec.generate(model, drafter, PROMPT, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(again.sequences, first.sequences)
    assert torch.equal(second.sequences, mtpspec.generate(model, None, other, max_new_tokens=12, eos_token_id=[]).sequences)


def test_sampled_drafts_carry_the_law_they_were_drawn_from():
    model = tiny_model("llama")
    target = Target(model)
    drafter = drafters(model)["near"]
    cfg = SamplingConfig(temperature=0.8, top_k=10, seed=0)
    state, _ = prefill(target, PROMPT, max_new_tokens=30, sampling=cfg, eos_token_id=[])
    from mtpspec.core.draft import DraftInput

    d = drafter.propose(DraftInput(state.tokens, state.hidden, state.cache), 4, cfg, state.generator)
    assert d.q is not None and d.q.shape == (4, target.vocab_size)
    assert torch.allclose(d.q.sum(-1), torch.ones(4)) and bool((d.q[torch.arange(4), d.tokens] > 0).all())
    assert int((d.q[0] > 0).sum()) <= 10  # top-k applied to q as to the target's p


def test_a_draft_model_with_another_vocabulary_is_refused():
    target = Target(tiny_model("llama"))
    with pytest.raises(InputError, match=r"vocabulary \(50 tokens\) differs from the target's \(97\).*mtpspec train "
                                         r"--kind draft-model"):
        DraftModelDrafter(tiny_model("llama", vocab_size=50), target)
