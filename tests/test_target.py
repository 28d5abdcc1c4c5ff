"""The target adapter computes what the Hugging Face model computes: logits and hidden states
match HF's forward on every family, whole or token by token against the cache."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, tiny_model

import mtpspec
from mtpspec.core.target import rms_norm


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_matches_hf(family):
    model = tiny_model(family)
    t = mtpspec.Target(model)
    ids = torch.randint(4, 97, (1, 20), generator=torch.Generator().manual_seed(0))
    ref = model(ids, output_hidden_states=True)
    out = t.forward(ids, t.new_cache(64), hidden_layers=(0, 1, -1))
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-4)
    D = model.config.hidden_size
    for j, hs in enumerate((ref.hidden_states[0], ref.hidden_states[1], ref.hidden_states[-1])):
        torch.testing.assert_close(out.hidden[..., j * D:(j + 1) * D], hs, rtol=0, atol=1e-4)
    # the same logits token by token against the cache
    c = t.new_cache(64)
    t.forward(ids[:, :12], c)
    rest = torch.cat([t.forward(ids[:, i:i + 1], c).logits for i in range(12, 20)], 1)
    torch.testing.assert_close(rest, ref.logits[:, 12:], rtol=0, atol=1e-4)


def test_rms_norm_is_bitwise_hf():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for dtype in (torch.float32, torch.bfloat16):
        norm = LlamaRMSNorm(48, eps=1e-5)
        norm.weight.data.normal_()
        norm = norm.to(dtype)
        x = torch.randn(7, 48).to(dtype)
        assert torch.equal(rms_norm(x, norm.weight, 1e-5), norm(x))


def test_growable_and_fixed_caches():
    t = mtpspec.Target(tiny_model("llama"))
    grow = t.new_cache()
    t.forward(torch.tensor([[5] * 70]), grow)
    assert grow.length == 70 and grow.capacity >= 70
    fixed = t.new_cache(8)
    with pytest.raises(mtpspec.InputError, match="slots"):
        t.forward(torch.tensor([[5] * 70]), fixed)


@pytest.mark.parametrize("family, window", [
    ("mistral", {"sliding_window": 6}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}),  # layer 1 slides
])
def test_sliding_window_greedy_equals_hf_across_the_window(family, window):
    """The cache keeps every position and the mask slides: greedy output equals HF's far past
    the window, with drafts rolled back on every round."""
    from conftest import OracleDrafter, hf_greedy

    model = tiny_model(family, **window)
    full = tiny_model(family)  # the same weights (same seed) with full attention
    ids = torch.randint(4, 97, (1, 20), generator=torch.Generator().manual_seed(1))
    ref = hf_greedy(model, ids, 40, eos=[])
    assert not torch.equal(ref, hf_greedy(full, ids, 40, eos=[]))  # the window changes the text
    for drafter, k in ((None, 0), (mtpspec.MTPHead.for_target(model), 3), (OracleDrafter(ref[0].tolist(), 97), 4)):
        out = mtpspec.generate(model, drafter, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, ref), (family, k)


def test_phi3_fused_projections_equal_hf_greedy():
    """Phi-3 fuses q/k/v and gate/up; the adapter reads row views of the fused weights."""
    from conftest import COMMON, OracleDrafter, hf_greedy
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    model = Phi3ForCausalLM(Phi3Config(**{**COMMON, "pad_token_id": 0})).eval()
    ids = torch.randint(4, 97, (1, 15), generator=torch.Generator().manual_seed(2))
    ref = hf_greedy(model, ids, 30, eos=[])
    for drafter, k in ((None, 0), (mtpspec.MTPHead.for_target(model), 3), (OracleDrafter(ref[0].tolist(), 97), 4)):
        out = mtpspec.generate(model, drafter, ids, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, ref), k
