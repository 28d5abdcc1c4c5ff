"""The head is zero-copy and self-describing: it shares the target's embedding and LM head,
holds nothing that grows with the context, and refuses to load beside another target."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

import mtpspec
from mtpspec import HeadConfig, MTPHead, Target


def _tensors(head: MTPHead) -> dict[str, torch.Size]:
    d = {f"p:{n}": p.shape for n, p in head.named_parameters()}
    d.update({f"b:{n}": b.shape for n, b in head.named_buffers()})
    return d


def test_head_shares_embedding_norm_and_lm_head_storage():
    model = tiny_model("llama")
    head = MTPHead.for_target(model)
    assert head.target.embed.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert head.target.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    assert head.target.final_norm is model.model.norm
    # none of the target's tensors is a parameter or buffer of the head, or saved with it
    target_ptrs = {t.data_ptr() for t in model.state_dict().values()}
    assert not target_ptrs & {t.data_ptr() for t in head.state_dict().values()}
    assert head.num_parameters() == sum(p.numel() for p in head.parameters())
    assert head.inference_bytes() == sum(p.numel() * 4 for p in head.parameters())


def test_head_holds_nothing_that_grows_with_the_context():
    model = tiny_model("llama")
    head = MTPHead.for_target(model)
    before = _tensors(head)
    attrs_before = set(vars(head))
    mtpspec.generate(model, head, torch.randint(4, 97, (1, 400)), max_new_tokens=40, num_draft_tokens=4)
    assert _tensors(head) == before
    assert set(vars(head)) == attrs_before
    # the head's size does not depend on the target's context length at all
    long_model = tiny_model("llama", max_position_embeddings=8192)
    assert MTPHead.for_target(long_model).num_parameters() == head.num_parameters()


def test_draft_vocab_buffer_is_counted_and_drafts_map_back():
    model = tiny_model("llama")
    ids = torch.tensor([5, 9, 17, 40, 41, 60, 70, 96])
    head = MTPHead.for_target(model, HeadConfig(draft_vocab_size=8), draft_ids=ids)
    extra = head.draft_weight.numel() * 4 + ids.numel() * 8
    assert head.inference_bytes() == head.num_parameters() * 4 + extra
    out = mtpspec.generate(model, head, torch.randint(4, 97, (1, 5)), max_new_tokens=20, num_draft_tokens=3,
                           eos_token_id=[])
    assert out.sequences.shape == (1, 25)
    from mtpspec import DraftInput, SamplingConfig

    cache = Target(model).new_cache()
    step = Target(model).forward(torch.tensor([[4, 5, 6]]), cache)
    context = torch.tensor([[4, 5, 6, 7]])
    head.copy_context = False
    d = head.propose(DraftInput(context, step.hidden[:, -1], cache), 5, SamplingConfig(), None)
    assert set(d.tokens.tolist()) <= set(ids.tolist())
    # copy_context: each round also scores the context's tokens outside the draft vocabulary
    head.copy_context = True
    vocab, extra = head.round_vocab(context)
    assert vocab.tolist() == ids.tolist() + [4, 6, 7]
    assert torch.equal(extra, Target(model).lm_head.weight[vocab[8:]])
    d = head.propose(DraftInput(context, step.hidden[:, -1], cache), 5, SamplingConfig(), None)
    assert set(d.tokens.tolist()) <= set(vocab.tolist())


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is None and b is None or a is not None and b is not None and torch.equal(a, b)


def test_round_vocab_kept_between_rounds_is_the_whole_contexts():
    """A request's round vocabulary kept in its memo, round after round as its context grows,
    is the one computed from the whole context: the same ids in the same order, the same rows."""
    model = tiny_model("llama")
    ids = torch.tensor([5, 9, 17, 40, 41, 60, 70, 96])
    head = MTPHead.for_target(model, HeadConfig(draft_vocab_size=8), draft_ids=ids)
    g = torch.Generator().manual_seed(0)
    context, memo = torch.tensor([[5, 9]]), {}
    for _ in range(40):
        got, want = head.round_vocab(context, memo), head.round_vocab(context)
        assert _same(got[0], want[0]) and _same(got[1], want[1])
        context = torch.cat([context, torch.randint(4, 97, (1, int(torch.randint(1, 4, (1,), generator=g))),
                                                    generator=g)], 1)
    assert 10 < len(memo["round_vocab"][2]) < 89  # rows were added along the way, and not every id was seen
    # kept for another context (its last covered id differs): computed from the whole context
    other = context.clone()
    other[0, memo["round_vocab"][0] - 1] = 5 if int(other[0, memo["round_vocab"][0] - 1]) != 5 else 9
    other = torch.cat([other, torch.tensor([[3]])], 1)
    assert _same(head.round_vocab(other, memo)[0], head.round_vocab(other)[0])


def test_round_rope_is_ropes_own_call():
    head = MTPHead.for_target(tiny_model("llama"))
    like = torch.zeros(1, 1, 4)  # the tables' dtype and device
    for L, k in [(0, 1), (7, 3), (7, 3), (100, 6), (5, 2)]:
        cos, sin = head.rope(torch.arange(L, L + k).unsqueeze(0), like)
        got = head.round_rope(L, k, like)
        assert torch.equal(got[0], cos[0]) and torch.equal(got[1], torch.cat([-sin[0, :, :sin.shape[-1] // 2],
                                                                               sin[0, :, sin.shape[-1] // 2:]], -1))


def test_save_load_round_trip(tmp_path):
    model = tiny_model("qwen3")
    head = MTPHead.for_target(model, HeadConfig(num_blocks=2, hidden_layers=(-2, -1), mlp_ratio=1.0))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    head.recommended_k = 5
    head.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "mtp_head.json").read_text())
    assert meta["target"]["architecture"] == "qwen3" and meta["target"]["vocab_size"] == 97
    loaded = MTPHead.from_pretrained(tmp_path, model)
    assert loaded.config == head.config and loaded.recommended_k == 5
    for (n, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
    ids = torch.randint(4, 97, (1, 9))
    a = mtpspec.generate(model, head, ids, max_new_tokens=12, num_draft_tokens=3)
    b = mtpspec.generate(model, loaded, ids, max_new_tokens=12, num_draft_tokens=3)
    assert a.stats.accept_hist == b.stats.accept_hist


def test_loading_beside_a_different_target_fails(tmp_path):
    MTPHead.for_target(tiny_model("llama", seed=0)).save_pretrained(tmp_path)
    with pytest.raises(mtpspec.HeadMismatchError, match="embedding_fingerprint"):
        MTPHead.from_pretrained(tmp_path, tiny_model("llama", seed=1))
    with pytest.raises(mtpspec.HeadMismatchError, match="hidden_size"):
        MTPHead.from_pretrained(tmp_path, tiny_model("llama", hidden_size=48))
    with pytest.raises(mtpspec.HeadMismatchError, match="architecture"):
        MTPHead.from_pretrained(tmp_path, tiny_model("qwen2"))


def test_fingerprint_survives_bf16():
    model = tiny_model("llama")
    fp32 = Target(model).identity().embedding_fingerprint
    assert Target(tiny_model("llama").to(torch.bfloat16)).identity().embedding_fingerprint == fp32


def test_missing_head_dir_is_a_clear_error(tmp_path):
    with pytest.raises(mtpspec.InputError, match="not a saved mtpspec head"):
        MTPHead.from_pretrained(tmp_path / "nope", tiny_model("llama"))


def test_unsupported_architecture_is_refused():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(mtpspec.UnsupportedModelError, match=r"GPT2LMHeadModel.*Supported: Llama"):
        MTPHead.for_target(gpt2)
    with pytest.raises(mtpspec.UnsupportedModelError, match="gpt2"):
        mtpspec.generate(gpt2, None, torch.tensor([[1, 2]]))


def test_partial_rotary_is_refused_with_the_reason():
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = Phi3Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, pad_token_id=0)
    cfg.rope_parameters = {**(cfg.rope_parameters or {}), "partial_rotary_factor": 0.5}
    with pytest.raises(mtpspec.UnsupportedModelError, match="partial_rotary_factor"):
        Target(Phi3ForCausalLM(cfg))


def test_bad_head_config_is_refused():
    with pytest.raises(mtpspec.InputError, match="num_blocks"):
        HeadConfig(num_blocks=0)
    with pytest.raises(mtpspec.InputError, match="out of range"):
        MTPHead.for_target(tiny_model("llama"), HeadConfig(kv_layer=5))
    with pytest.raises(mtpspec.InputError, match="Unknown HeadConfig"):
        HeadConfig.from_dict({"bogus": 1})


def test_bf16_target_runs_and_matches_its_own_greedy():
    model = tiny_model("llama").to(torch.bfloat16)
    head = MTPHead.for_target(model)
    assert next(head.parameters()).dtype == torch.bfloat16
    ids = torch.randint(4, 97, (1, 7))
    plain = mtpspec.generate(model, None, ids, max_new_tokens=16, num_draft_tokens=0, eos_token_id=[])
    spec = mtpspec.generate(model, head, ids, max_new_tokens=16, num_draft_tokens=3, eos_token_id=[])
    # the verify pass is row-invariant, so bf16 speculative output is plain bf16 output exactly
    assert torch.equal(plain.sequences, spec.sequences)


def test_recommended_k_per_dtype(tmp_path):
    from mtpspec.pretrained import FALLBACK_K, default_k

    model = tiny_model("llama")
    head = MTPHead.for_target(model)
    assert default_k(head) == FALLBACK_K
    head.recommended_k = {"float32": 4, "bfloat16": 2}
    head.save_pretrained(tmp_path)
    assert default_k(MTPHead.from_pretrained(tmp_path, model)) == 4
    assert default_k(MTPHead.from_pretrained(tmp_path, tiny_model("llama").to(torch.bfloat16))) == 2
    head.recommended_k = {"float32": 0}  # measured: nothing beats plain decoding in fp32
    assert default_k(head) == 0
    other = MTPHead.for_target(tiny_model("llama").to(torch.bfloat16))
    other.recommended_k = {"float32": 0}  # nothing recorded for bf16
    assert default_k(other) == FALLBACK_K


@pytest.mark.parametrize("damage", ["truncate", "bad_json", "missing_key", "wrong_shape"])
def test_damaged_head_files_are_refused_clearly(tmp_path, damage):
    model = tiny_model("llama")
    MTPHead.for_target(model).save_pretrained(tmp_path)
    weights, meta = tmp_path / "mtp_head.safetensors", tmp_path / "mtp_head.json"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "bad_json":
        meta.write_text("{not json")
    elif damage == "missing_key":
        meta.write_text(meta.read_text().replace('"head_config"', '"head_cfg"'))
    else:
        other = MTPHead.for_target(model, HeadConfig(mlp_ratio=1.0))
        other.save_pretrained(tmp_path / "other")
        (tmp_path / "other" / "mtp_head.safetensors").replace(weights)
    with pytest.raises(mtpspec.InputError, match=str(tmp_path)):
        MTPHead.from_pretrained(tmp_path, model)


@pytest.mark.parametrize("layers, deepest", [((1, -1), 1), ((-1, 0), 0), ((0, -2, 2), 2)])
def test_fused_features_start_as_the_deepest_layer_alone(layers, deepest):
    """A fresh head reading several layers starts where a one-layer head starts: its state is the
    deepest listed layer's features, the other layers' weights zero until training moves them.
    (The tiny target has 2 layers: features 0-2, -1 = 2, -2 = 1.)"""
    model = tiny_model("llama")
    head = MTPHead.for_target(model, HeadConfig(hidden_layers=layers))
    D = head.target.hidden_size
    feats = torch.randn(2, 3, len(layers) * D)
    assert torch.allclose(head.initial_state(feats), feats[..., deepest * D:(deepest + 1) * D])
