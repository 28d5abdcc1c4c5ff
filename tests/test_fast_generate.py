"""The data writer's faster generation: the same attention and the same top-p distribution as HF's."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, QUIRKY, any_model
from transformers.generation.logits_process import TopPLogitsWarper

from mtpspec.training import fast_generate
from mtpspec.training.fast_generate import NAME, NucleusSampler, attention_implementation, generation


@pytest.mark.parametrize("family", list(FAMILIES) + list(QUIRKY))
def test_grouped_decode_attention_equals_sdpa_on_a_left_padded_batch(family, monkeypatch):
    """Decode steps with the grouped kernel give HF "sdpa"'s logits (fp32: to rounding), with
    padding, grouped heads, sliding windows and soft-capped scores; prefill is "sdpa" itself."""
    calls = []
    kernel = fast_generate.attention
    monkeypatch.setattr(fast_generate, "attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    model = any_model(family)
    if model.config._attn_implementation != "sdpa":  # Gemma 2 (soft-capped scores) runs "eager"
        assert generation(model)["attention"] == model.config._attn_implementation  # and keeps it
        return
    assert generation(model)["attention"] == NAME
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[1, :1] = 0
    steps = 6  # past the tiny models' sliding window

    def decode() -> list[torch.Tensor]:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache, m, logits = out.past_key_values, mask, [out.logits[:, -1]]
        for _ in range(steps):  # one-token decode steps: the fast path
            nxt = logits[-1].argmax(-1, keepdim=True)
            m = torch.cat([m, torch.ones(3, 1, dtype=torch.long)], 1)
            out = model(input_ids=nxt, attention_mask=m, cache=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[:, -1])
        return logits

    with torch.no_grad():
        want = decode()
        before = model.config._attn_implementation
        with attention_implementation(model, NAME):
            got = decode()
        assert model.config._attn_implementation == before  # the caller's model is given back as it was
    assert len(calls) == steps * model.config.num_hidden_layers  # every decode step took the fast path
    for a, b in zip(want, got):
        # fp32 sums in another order: Gemma 4's E model differs by 1.7e-5 (one logit of 291) on a
        # Zen 4 EPYC, 0 on the Xeon; a wrong mask or window moves logits by ~1e-1
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_nucleus_sampler_draws_from_hf_top_p_distribution():
    """The sampler draws what HF's temperature + top-p would, also where the nucleus is wider
    than its candidates (those rows take the full sort)."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 40, generator=g) * torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0, 0.05])[:, None]
    want = TopPLogitsWarper(0.9)(None, scores / 0.7).softmax(-1)  # (6, 40): HF's nucleus distribution
    assert int((want[5] > 0).sum()) > 5  # the flat row's nucleus spills past k = 5
    n = 4000
    torch.manual_seed(1)
    out = NucleusSampler(0.7, 0.9, k=5)(None, scores.repeat(n, 1))  # (6n, 40)
    assert torch.equal((out == 0).sum(-1), torch.ones(6 * n, dtype=torch.long))  # one token per row
    freq = (out == 0).float().view(n, 6, 40).mean(0)  # (6, 40)
    assert torch.all(freq[want == 0] == 0)  # nothing outside the nucleus
    assert (freq - want).abs().max() < 0.03  # 4,000 draws per row: a few standard errors


def test_nucleus_sampler_refuses_what_it_cannot_sample():
    with pytest.raises(ValueError, match="temperature > 0"):
        NucleusSampler(0.0, 0.9)
    with pytest.raises(ValueError, match="top_p <= 1"):
        NucleusSampler(1.0, 1.5)


def test_length_buckets_partition_the_rows_shortest_first():
    from mtpspec.training.fast_generate import length_buckets

    lengths = [60, 586, 45, 70, 360, 50, 66, 58] * 12
    buckets = length_buckets(lengths, 192)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))  # every row once
    widths = [[lengths[i] for i in b] for b in buckets]
    assert all(max(a) <= min(b) for a, b in zip(widths, widths[1:]))  # contiguous in length
    assert len(buckets) >= 2 and max(widths[0]) <= 70  # the long passages no longer pad the short rows
    assert length_buckets([50] * 10, 192) == [list(range(10))]  # equal lengths: one call
    assert length_buckets([10, 20], 8, bucket_cost=10**9) == [[0, 1]]  # a call costs more than padding saves
    assert length_buckets([], 8) == []
