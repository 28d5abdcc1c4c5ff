"""The target adapter computes what the Hugging Face model computes: logits and hidden states
match HF's forward on every family, whole or token by token against the cache; on the families
with their own quirks, greedy output equals HF's greedy `generate` with and without drafts."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, QUIRKY, OracleDrafter, any_model, hf_greedy, quirky_model, tiny_model

import mtpspec
from mtpspec.core.target import SUPPORTED, rms_norm


def test_every_supported_family_is_tested():
    tested = {cfg.model_type for cfg, _, _ in [*FAMILIES.values(), *QUIRKY.values()]}
    assert set(SUPPORTED) == tested | {"phi3"}  # phi3: test_phi3_fused_projections_...


@pytest.mark.parametrize("family", list(FAMILIES) + list(QUIRKY))
def test_forward_matches_hf(family):
    model = any_model(family)
    t = mtpspec.Target(model)
    ids = torch.randint(4, 97, (1, 20), generator=torch.Generator().manual_seed(0))
    ref = model(ids, output_hidden_states=True)
    out = t.forward(ids, t.new_cache(64), hidden_layers=(0, 1, -1))
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-4)
    D = model.config.hidden_size
    # rtol: large activations, fp32 rounding of another summation order (native kernels)
    for j, hs in enumerate((ref.hidden_states[0], ref.hidden_states[1], ref.hidden_states[-1])):
        torch.testing.assert_close(out.hidden[..., j * D:(j + 1) * D], hs, rtol=1e-4, atol=1e-4)
    # the same logits token by token against the cache
    c = t.new_cache(64)
    t.forward(ids[:, :12], c)
    rest = torch.cat([t.forward(ids[:, i:i + 1], c).logits for i in range(12, 20)], 1)
    torch.testing.assert_close(rest, ref.logits[:, 12:], rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2", "granite"])  # qwen2: q/k/v biases; granite: MLP biases too
def test_stacked_projections_move_weights_without_changing_or_copying_them(family):
    """The adapter runs q/k/v and gate/up as one matmul each by re-homing the parameters as row
    views of one tensor: the model keeps every value, its parameters and its memory, and HF's
    own forward is unchanged; a second adapter on the same model copies nothing."""
    model = any_model(family)
    ids = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    ref = model(ids).logits
    t = mtpspec.Target(model)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert dict(model.named_parameters()) == params  # the same Parameter objects
    a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
    stacked = (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)
    assert len({w.untyped_storage().data_ptr() for w in stacked}) == 1  # one storage, row views of it
    assert a.k_proj.weight.data_ptr() == a.q_proj.weight.data_ptr() + a.q_proj.weight.nbytes
    assert m.up_proj.weight.data_ptr() == m.gate_proj.weight.data_ptr() + m.gate_proj.weight.nbytes
    assert torch.equal(model(ids).logits, ref)
    ptrs = [p.data_ptr() for p in model.parameters()]
    t2 = mtpspec.Target(model)
    assert [p.data_ptr() for p in model.parameters()] == ptrs  # nothing copied or moved again
    assert torch.equal(t.forward(ids, t.new_cache(32)).logits, t2.forward(ids, t2.new_cache(32)).logits)


def test_a_model_cast_or_given_new_weights_after_wrapping_is_read_again():
    """`model.to(dtype)` or a weight swapped in gives parameters new data; the adapter notices and
    reads the layers again instead of computing with the stacked copies of the old weights."""
    model = tiny_model("llama")
    t = mtpspec.Target(model)
    ids = torch.randint(4, 97, (1, 10), generator=torch.Generator().manual_seed(1))

    def fresh_logits():
        f = mtpspec.Target(model)
        return f.forward(ids, f.new_cache(32)).logits

    old = t.forward(ids, t.new_cache(32)).logits
    mlp = model.model.layers[1].mlp
    mlp.gate_proj.weight.data = torch.randn_like(mlp.gate_proj.weight)  # a weight swapped in
    new = t.forward(ids, t.new_cache(32)).logits
    assert not torch.equal(new, old) and torch.equal(new, fresh_logits())
    torch.testing.assert_close(new, model(ids).logits, rtol=0, atol=1e-4)
    model.to(torch.bfloat16)
    out = t.forward(ids, t.new_cache(32)).logits
    assert torch.equal(out, fresh_logits())


@pytest.mark.parametrize("family", ["llama", "olmo2", "smollm3", "gemma3_text"])
def test_weights_describe_every_layer_by_reference(family):
    """`Target.weights()`, what both forwards read: the model's own tensors (stacked q/k/v and
    gate/up as views of them), each norm where the family puts it, and each layer's RoPE table,
    window and activation as the config says."""
    model = any_model(family)
    t = mtpspec.Target(model)
    w = t.weights()
    cfg = model.config
    assert len(w.layers) == t.num_layers and w.llama_norms == (family in ("llama", "smollm3"))
    assert w.lm_head.weight is model.lm_head.weight and w.final_norm.weight is model.model.norm.weight
    for i, (L, layer) in enumerate(zip(w.layers, model.model.layers)):
        a, m = layer.self_attn, layer.mlp
        assert torch.equal(L.qkv.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        assert L.qkv.weight.data_ptr() == a.q_proj.weight.data_ptr()  # a view of the model's own memory
        assert torch.equal(L.gate_up.weight, torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        assert L.o.weight is a.o_proj.weight and L.down.weight is m.down_proj.weight
        assert L.scale == a.scaling and L.window == t.windows[i]
        pre = layer.input_layernorm if family != "olmo2" else None
        assert (L.attn_norm is None) == (pre is None) and (pre is None or L.attn_norm.weight is pre.weight)
        if family == "llama":
            assert L.attn_norm.eps == cfg.rms_norm_eps and L.mlp_norm.weight is layer.post_attention_layernorm.weight
            assert L.attn_out_norm is None and L.q_norm is None and L.rope == "" and L.activation == "silu"
        if family == "olmo2":  # sublayer outputs only; q/k norms over all heads
            assert L.mlp_norm is None and L.attn_out_norm.weight is layer.post_attention_layernorm.weight
            assert L.mlp_out_norm.weight is layer.post_feedforward_layernorm.weight
            assert L.q_norm.weight is a.q_norm.weight and L.k_norm.weight is a.k_norm.weight and L.qk_norm_whole
        if family == "smollm3":  # NoPE layers
            assert L.has_rope == bool(cfg.no_rope_layers[i]) and L.rope in ("", None)
        if family == "gemma3_text":  # sandwich norms, per-head q/k norms, a RoPE table per layer type, GELU
            assert L.mlp_norm.weight is layer.pre_feedforward_layernorm.weight and L.mlp_out_norm is not None
            assert L.q_norm is not None and not L.qk_norm_whole
            assert L.rope == cfg.layer_types[i] and L.activation != "silu"
    if family == "smollm3":
        assert [L.rope for L in w.layers] == ["", None]  # the tiny config's layer 1 has no RoPE


def test_weights_follow_a_weight_given_new_data():
    model = tiny_model("llama")
    t = mtpspec.Target(model)
    before = t.weights()
    gate = model.model.layers[0].mlp.gate_proj.weight
    gate.data = torch.randn_like(gate)
    after = t.weights()
    assert not torch.equal(after.layers[0].gate_up.weight, before.layers[0].gate_up.weight)
    assert after.layers[0].gate_up.weight.data_ptr() == gate.data_ptr()


def test_rms_norm_is_bitwise_hf():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for width, rows, spread in ((48, 7, 1.0), (576, 1, 30.0), (576, 300, 0.01), (2048, 5, 3.0)):
            norm = LlamaRMSNorm(width, eps=1e-5)
            norm.weight.data.normal_(generator=g)
            norm = norm.to(dtype)
            x = (torch.randn(rows, width, generator=g) * spread).to(dtype)
            assert torch.equal(rms_norm(x, norm.weight, 1e-5), norm(x)), (dtype, width, rows)


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


@pytest.mark.parametrize("family", list(QUIRKY))
def test_quirky_family_greedy_equals_hf(family):
    """Greedy ids equal HF's greedy `generate` in fp32 without drafts, with a random head (chain
    and tree) and with an oracle that exercises every rollback, past the sliding window."""
    model = quirky_model(family)
    ids = torch.randint(4, 97, (1, 15), generator=torch.Generator().manual_seed(3))
    ref = hf_greedy(model, ids, 30, eos=[])
    assert len(set(ref[0, 15:].tolist())) > 3  # a varied continuation, not one token repeated
    head = mtpspec.MTPHead.for_target(model)
    runs = [(None, 0, False), (head, 3, False), (head, 6, True), (OracleDrafter(ref[0].tolist(), 97), 4, False)]
    for drafter, k, tree in runs:
        out = mtpspec.generate(model, drafter, ids, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[], tree=tree)
        assert torch.equal(out.sequences, ref), (family, k, tree)


@pytest.mark.parametrize("family", list(QUIRKY))
def test_quirky_family_bf16_speculative_equals_plain_decoding(family):
    """In bf16 the quirks (soft-capped scores through the chosen attention kernel, norms through
    the model's modules, scales) keep each row's arithmetic its own: drafts of every length and
    a tree never change a token of plain bf16 decoding, past the sliding window."""
    model = quirky_model(family).to(torch.bfloat16)
    assert mtpspec.Target(model).plan.row_invariant
    ids = torch.randint(4, 97, (1, 13), generator=torch.Generator().manual_seed(5))
    plain = mtpspec.generate(model, None, ids, max_new_tokens=40, num_draft_tokens=0, eos_token_id=[])
    for k in (1, 3, 6):
        oracle = OracleDrafter(plain.sequences[0].tolist(), vocab=97, seed=k)
        out = mtpspec.generate(model, oracle, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences), (family, k)
        assert out.stats.rounds < 39  # drafts were accepted, so rows really ran together
    out = mtpspec.generate(model, mtpspec.MTPHead.for_target(model), ids, max_new_tokens=40, num_draft_tokens=6,
                           eos_token_id=[], tree=True)
    assert torch.equal(out.sequences, plain.sequences), (family, "tree")


@pytest.mark.parametrize("family", ["gemma2", "smollm3"])
def test_the_window_and_soft_caps_change_the_text(family):
    """The quirks the greedy test relies on are live: without them HF's own text differs. (The
    final soft-cap keeps the argmax; test_forward_matches_hf checks the capped logits.)"""
    ids = torch.randint(4, 97, (1, 15), generator=torch.Generator().manual_seed(3))
    ref = hf_greedy(quirky_model(family), ids, 30, eos=[])
    if family == "gemma2":
        for off in ({"sliding_window": 4096}, {"attn_logit_softcapping": None}):
            assert not torch.equal(ref, hf_greedy(quirky_model(family, **off), ids, 30, eos=[])), off
        t = mtpspec.Target(quirky_model(family))
        capped = t.forward(ids, t.new_cache()).logits
        uncapped = quirky_model(family, final_logit_softcapping=None)(ids).logits
        assert capped.abs().max() < 3.0 < uncapped.abs().max()
    else:
        assert not torch.equal(ref, hf_greedy(quirky_model(family, use_sliding_window=False), ids, 30, eos=[]))


def test_head_shares_the_targets_embedding_scale_and_logit_transform():
    """The head embeds and projects exactly as the target does: its logits on the target's
    final normed state equal the target's logits (Granite: multipliers; Gemma 2: soft-cap)."""
    for family in ("granite", "gemma2"):
        model = quirky_model(family)
        t = mtpspec.Target(model)
        head = mtpspec.MTPHead.for_target(t)
        ids = torch.randint(4, 97, (1, 9), generator=torch.Generator().manual_seed(4))
        ref = model(ids, output_hidden_states=True)
        torch.testing.assert_close(t.embed_tokens(ids), ref.hidden_states[0], rtol=0, atol=0)
        # hidden_states[-1] is HF's final normed state
        torch.testing.assert_close(head.project(ref.hidden_states[-1]).float(), ref.logits, rtol=0, atol=1e-4)


def test_bidirectional_attention_is_refused_with_the_reason():
    model = quirky_model("gemma3_text", use_bidirectional_attention=True)
    with pytest.raises(mtpspec.UnsupportedModelError, match="use_bidirectional_attention"):
        mtpspec.Target(model)


@pytest.mark.parametrize("family", ["helium", "smollm3", "gemma3_text"])
def test_head_rotates_queries_as_its_kv_layer_rotated_the_keys(family):
    """Whatever layer the head reads, its queries get that layer's RoPE as HF applies it to the
    keys: Helium's interleaved pairs, no rotation in SmolLM3's NoPE layer, Gemma 3's table for
    the layer's type."""
    import importlib

    from mtpspec import HeadConfig
    from mtpspec.core.rope import apply_rope

    name = family.removesuffix("_text")
    hf = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    model = quirky_model(family)
    t = mtpspec.Target(model)
    pos = torch.arange(5, 12)[None]  # (1, T)
    x = torch.randn(1, t.num_heads, 7, t.head_dim, generator=torch.Generator().manual_seed(6))  # (1, H, T, hd)
    for layer in range(t.num_layers):
        head = mtpspec.MTPHead.for_target(t, HeadConfig(kv_layer=layer))
        cos, sin = head.rope(pos, x)  # (1, T, hd)
        ours = apply_rope(x, cos[:, None], sin[:, None], head.blocks[0].interleaved_rope)
        if family == "gemma3_text":
            table = model.model.rotary_emb(x, pos, model.config.layer_types[layer])
        else:
            table = model.model.rotary_emb(x, pos)
        rotates = getattr(model.model.layers[layer].self_attn, "use_rope", True)
        ref = hf.apply_rotary_pos_emb(x, x, *table)[0] if rotates else x
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    if family == "smollm3":
        assert not model.model.layers[1].self_attn.use_rope  # the NoPE case was exercised


def test_cache_planes_copy_only_new_slots_and_follow_keep():
    """Planes hold the committed slots of the cache (plane 0 is the cache itself); a later call
    brings them up to date after the cache grew, and `keep` marks moved slots stale."""
    from mtpspec.core.cache import KVCache

    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 64, 4, generator=g), torch.randn(2, 3, 64, 4, generator=g)
    cache = KVCache(keys.clone(), values.clone(), length=10)
    kp, vp = cache.planes(3, 10)
    assert kp.shape == (2, 3, 3, 64, 4)
    assert cache.keys.data_ptr() == kp[:, 0].data_ptr()  # the cache lives in plane 0
    assert all(torch.equal(kp[:, j, :, :10], keys[:, :, :10]) and torch.equal(vp[:, j, :, :10], values[:, :, :10])
               for j in range(3))
    kp[:, 1:, :, :] = -1.0  # a branch overwrites its plane's tail (and here, everything else too)
    cache.keys[:, :, 10:14] = 7.0  # a verify appends 4 rows; keep 2 of them, moved into place
    cache.length = 14
    cache.keep(10, [1, 3])
    kp, _ = cache.planes(2, 12)
    # slots 0..9 were synced before and stay as the planes had them; 10..11 come fresh from the cache
    assert torch.equal(kp[:, 1:, :, 10:12], cache.keys[:, None, :, 10:12].expand(-1, 2, -1, -1, -1))
    assert (kp[:, 1:, :, :10] == -1.0).all()  # not copied again: only new slots are
    kp2, _ = cache.planes(4, 12)  # more planes: a new store, all synced
    assert all(torch.equal(kp2[:, j, :, :12], cache.keys[:, :, :12]) for j in range(4))


def test_a_layered_cache_keeps_reserves_and_lays_out_planes_per_store():
    """Layers of different shapes (Gemma 4's sliding / full heads) and layers that share another's
    keys and values: a shared layer's entry is its producer's (no memory of its own), and keep,
    reserve and planes move every store's slots as a uniform cache moves its own."""
    from mtpspec.core.cache import KVCache

    c = KVCache.layered([(2, 4), (1, 8)], share=[0, 1, 0, 1], capacity=64, dtype=torch.float32, fixed=False)
    assert [tuple(k.shape) for k in c.keys] == [(2, 64, 4), (1, 64, 8), (2, 64, 4), (1, 64, 8)]
    assert c.keys[2].data_ptr() == c.keys[0].data_ptr() and c.values[3].data_ptr() == c.values[1].data_ptr()
    g = torch.Generator().manual_seed(0)
    for i in (0, 1):
        c.keys[i].copy_(torch.randn(c.keys[i].shape, generator=g))
        c.values[i].copy_(torch.randn(c.values[i].shape, generator=g))
    before = [k.clone() for k in c.keys[:2]]
    c.length = 14
    c.keep(10, [1, 3])  # a tree path: slots 11 and 13 move to 10 and 11
    assert c.length == 12
    for i in (0, 1):
        assert torch.equal(c.keys[i][:, :10], before[i][:, :10])
        assert torch.equal(c.keys[i][:, 10:12], before[i][:, [11, 13]])
        k, v = c.layer(i + 2)  # the sharing layer reads the same slots
        assert k.shape == (1, *before[i].shape[:1], 12, before[i].shape[-1]) and torch.equal(k[0], c.keys[i][:, :12])
    kp, vp = c.planes(3, 12)
    assert kp[1].shape == (3, 1, 64, 8) and kp[3].data_ptr() == kp[1].data_ptr()
    assert c.keys[1].data_ptr() == kp[1][0].data_ptr()  # the cache lives in plane 0
    assert all(torch.equal(kp[i][j, :, :12], c.keys[i][:, :12]) for i in range(4) for j in range(3))
    kept = [k[:, :12].clone() for k in c.keys[:2]]
    c.reserve(100)  # a growable cache: reallocated, the slots kept, planes dropped
    assert c.capacity == 128 and not c.has_planes
    assert all(torch.equal(c.keys[i][:, :12], kept[i]) for i in (0, 1)) and c.keys[2].data_ptr() == c.keys[0].data_ptr()


def test_gemma4_cache_has_one_entry_per_layer_that_computes_keys_and_values():
    """Gemma 4's full-attention layers cache wider heads (fewer of them with k_eq_v), and the
    E-series' KV-shared layers cost no cache of their own."""
    t = mtpspec.Target(quirky_model("gemma4_text"))
    assert [t.kv_shape(i) for i in range(4)] == [(2, 8), (1, 16), (2, 8), (1, 16)]
    c = t.new_cache(64)
    assert [tuple(k.shape) for k in c.keys] == [(2, 64, 8), (1, 64, 16), (2, 64, 8), (1, 64, 16)]
    e = mtpspec.Target(quirky_model("gemma4_text_e"))  # 6 layers, the last two share layers 2 and 3's
    c = e.new_cache(64)
    assert len({k.data_ptr() for k in c.keys}) == 4
    assert c.keys[4].data_ptr() == c.keys[2].data_ptr() and c.keys[5].data_ptr() == c.keys[3].data_ptr()


def test_gemma4_mixture_of_experts_is_refused_with_the_reason():
    model = quirky_model("gemma4_text", enable_moe_block=True, num_experts=2, top_k_experts=1, moe_intermediate_size=16)
    with pytest.raises(mtpspec.UnsupportedModelError, match="mixture-of-experts"):
        mtpspec.Target(model)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma4_text", "gemma4_text_e"])
def test_a_multimodal_gemma_checkpoint_runs_its_text_decoder(family):
    """Google ships Gemma 3 and 4 as `...ForConditionalGeneration` (text and vision; audio too in
    Gemma 4). mtpspec runs the text decoder by reference (`TextOnly`: nothing copied or changed)
    and equals HF's greedy text of the whole multimodal model, with and without drafts."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma4Config, Gemma4ForConditionalGeneration

    text = quirky_model(family)
    if family == "gemma3_text":
        tiny_vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=8)
        mm = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text.config.to_dict(), vision_config=tiny_vision,
                                                         mm_tokens_per_image=4, tie_word_embeddings=False)).eval()
    else:
        mm = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text.config.to_dict(), vision_config=None,
                                                         audio_config=None, tie_word_embeddings=False)).eval()
    mm.model.language_model.load_state_dict(text.model.state_dict())
    mm.lm_head.load_state_dict(text.lm_head.state_dict())
    t = mtpspec.Target(mm)
    assert t.hf_model is mm and t.model.model is mm.model.language_model and t.model_type == family.removesuffix("_e")
    ids = torch.randint(4, 97, (1, 15), generator=torch.Generator().manual_seed(3))
    ref = hf_greedy(mm, ids, 20, eos=[])
    assert torch.equal(ref, hf_greedy(text, ids, 20, eos=[]))
    for drafter, k in ((None, 0), (OracleDrafter(ref[0].tolist(), 97), 4)):
        out = mtpspec.generate(mm, drafter, ids, max_new_tokens=20, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, ref), k
