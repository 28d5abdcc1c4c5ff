"""Configs: what each accepts, what it stores, and what it refuses with a message."""

from __future__ import annotations

import pytest

from mtpspec.config import SamplingConfig, TrainConfig
from mtpspec.errors import InputError


def test_hf_none_means_off():
    """Hugging Face writes top_k=None / top_p=None for "off": the same config as the defaults."""
    off = SamplingConfig(temperature=None, top_k=None, top_p=None)
    assert (off.temperature, off.top_k, off.top_p) == (0.0, 0, 1.0)
    assert off == SamplingConfig() and off.greedy
    on = SamplingConfig(temperature=0.7, top_k=None, top_p=None, seed=3)
    assert (on.temperature, on.top_k, on.top_p, on.seed) == (0.7, 0, 1.0, 3) and not on.greedy


@pytest.mark.parametrize("kw, message", [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"top_p": 1.5}, "top_p must be in"),
])
def test_sampling_values_out_of_range_are_refused(kw, message):
    with pytest.raises(InputError, match=message):
        SamplingConfig(**kw)


@pytest.mark.parametrize("kw, message", [
    ({"kind": "independent"}, "kind must be one of mtp, draft-model"),
    ({"max_draft_tokens": 0}, "max_draft_tokens"),
    ({"draft_model_layers": 0}, "draft_model_layers"),
    ({"step_decay": 1.5}, "step_decay"),
    ({"min_steps": -1}, "min_steps and warmup_steps must be >= 0"),
    ({"warmup_steps": -1}, "min_steps and warmup_steps must be >= 0"),
    ({"warmup_fraction": 1.5}, "warmup_fraction must be in"),
])
def test_train_config_refuses_bad_values(kw, message):
    with pytest.raises(InputError, match=message):
        TrainConfig(**kw)


def test_generate_takes_hf_style_none_as_off():
    import torch
    from conftest import tiny_model

    import mtpspec

    model = tiny_model("llama")
    ids = torch.tensor([[5, 17, 42]])
    plain = mtpspec.generate(model, None, ids, max_new_tokens=6, num_draft_tokens=0, eos_token_id=[])
    off = mtpspec.generate(model, None, ids, max_new_tokens=6, num_draft_tokens=0, eos_token_id=[],
                           temperature=None, top_k=None, top_p=None)
    assert torch.equal(off.sequences, plain.sequences)
