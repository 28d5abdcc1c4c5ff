"""The fused forward (core/fused.c), in bf16 and in fp32: one C call that computes what the
op-by-op torch path computes, up to the order of fp32 sums, with every row independent of the
others, so a verify pass (chain or tree) equals one-token passes bit for bit. Skipped with the
reason where the CPU or the compiler cannot run it."""

from __future__ import annotations

import ctypes

import pytest
import torch
from conftest import KERNELS, OracleDrafter, assert_tree_rows_equal_their_paths, kernel_dtype, tiny_model

import mtpspec
from mtpspec.core import fused
from mtpspec.core.rope import signed_sin

pytestmark = pytest.mark.skipif(fused.reason(torch.float32) is not None,
                                reason=f"no fused forward here: {fused.reason(torch.float32)}")

FUSED_FAMILIES = ("llama", "qwen2", "mistral")
# how much the fused forward may differ from the op-by-op one, relative to the largest value:
# bf16 rounds every step, fp32 only sums in another order
TOLERANCE = {torch.bfloat16: 0.05, torch.float32: 1e-4}


def _model(family: str, dtype: torch.dtype = torch.bfloat16, **overrides):
    return tiny_model(family, **overrides).to(dtype)


def _matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    so = fused._loaded(x.dtype)[0]
    y = torch.empty(x.shape[0], w.shape[0])
    so.fused_matmul(x.data_ptr(), x.shape[0], x.shape[1], w.data_ptr(), w.shape[0], y.data_ptr(), torch.get_num_threads())
    return y


def _need(dtype: torch.dtype) -> None:
    if (why := fused.reason(dtype)) is not None:
        pytest.skip(f"no fused {dtype} forward here: {why}")


@pytest.fixture(params=KERNELS)
def dtype(request):
    """Each test runs in bf16 on the AMX tiles (where the CPU has them) and on AVX-512 dot
    products, and in fp32 (AVX-512 FMA); the fixture's value is the dtype."""
    yield from kernel_dtype(request.param, fused.AMX_DENSE)


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def each_dtype(request):
    """bf16 and fp32, each where this machine runs it (with its default kernels)."""
    _need(request.param)
    return request.param


@pytest.mark.parametrize("shape", [(64, 32), (96, 576), (100, 40), (49, 33)])  # AMX-eligible and not
def test_matmul_is_a_matmul_whose_rows_do_not_depend_on_each_other(dtype, shape):
    n_out, n_in = shape
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n_out, n_in, generator=g).to(dtype)
    x = torch.randn(20, n_in, generator=g).to(dtype)
    ref = x.double() @ w.double().T
    together = _matmul(x, w)
    assert torch.allclose(together.double(), ref, rtol=1e-4, atol=1e-4 * n_in**0.5)
    for r in (1, 2, 5, 6, 7, 16, 17, 20):  # one block's or tile's rows, and more than one
        part = _matmul(x[:r].contiguous(), w)
        assert torch.equal(part, together[:r]), r
    for i in range(20):
        assert torch.equal(_matmul(x[i:i + 1].contiguous(), w), together[i:i + 1]), i


@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_fused_forward_computes_what_the_torch_path_computes(family, dtype):
    model = _model(family, dtype)
    tol = TOLERANCE[dtype]
    fast, slow = mtpspec.Target(model), mtpspec.Target(model, engine="torch")
    assert fast.engine == "fused" and slow.engine == "torch"
    ids = torch.randint(4, 97, (1, 40), generator=torch.Generator().manual_seed(1))
    cf, cs = fast.new_cache(64), slow.new_cache(64)
    a = fast.forward(ids, cf, hidden_layers=(0, 1, -1))
    b = slow.forward(ids, cs, hidden_layers=(0, 1, -1))
    assert a.logits.shape == b.logits.shape and a.hidden.shape == b.hidden.shape
    scale = b.logits.abs().max()
    assert (a.logits - b.logits).abs().max() <= tol * scale  # rounding, not a different model
    assert (a.hidden.float() - b.hidden.float()).abs().max() <= tol * b.hidden.float().abs().max()
    assert torch.equal(a.hidden[..., :32], b.hidden[..., :32])  # the embeddings themselves
    assert (a.logits.argmax(-1) == b.logits.argmax(-1)).float().mean() >= (0.9 if dtype == torch.bfloat16 else 1.0)
    assert cf.length == cs.length == 40
    assert (cf.keys.float() - cs.keys.float()).abs().max() <= tol * cs.keys.float().abs().max()


@pytest.mark.parametrize("family", FUSED_FAMILIES)
@pytest.mark.parametrize("context", [30, 70])  # committed slots: blocks of 16 shared by a chunk's queries, then a tail
def test_a_verify_pass_equals_one_token_passes_bit_for_bit(family, dtype, context):
    t = mtpspec.Target(_model(family, dtype))
    ids = torch.randint(4, 97, (1, context), generator=torch.Generator().manual_seed(2))
    new = torch.randint(4, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    c1, c2 = t.new_cache(128), t.new_cache(128)
    t.forward(ids, c1)
    t.forward(ids, c2)
    together = t.forward(new, c1, hidden_layers=(-2, -1))
    alone = [t.forward(new[:, i:i + 1], c2, hidden_layers=(-2, -1)) for i in range(9)]
    for i, one in enumerate(alone):
        assert torch.equal(together.logits[0, i], one.logits[0, 0]), i
        assert torch.equal(together.hidden[0, i], one.hidden[0, 0]), i
    assert torch.equal(c1.keys, c2.keys) and torch.equal(c1.values, c2.values)


def test_a_tree_row_equals_decoding_its_path_one_token_at_a_time(dtype):
    """Each tree row attends its ancestors where they lie in the cache: no copies, and the same
    bits as plain decoding of its path (which sees them in depth order right after the prompt)."""
    assert_tree_rows_equal_their_paths(mtpspec.Target(_model("llama", dtype)))


@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_speculative_equals_plain_decoding_through_the_fused_forward(family, each_dtype):
    model = _model(family, each_dtype)
    assert mtpspec.Target(model).engine == "fused"
    ids = torch.randint(4, 97, (1, 17), generator=torch.Generator().manual_seed(6))
    plain = mtpspec.generate(model, None, ids, max_new_tokens=40, num_draft_tokens=0, eos_token_id=[])
    for k in (1, 4, 8):
        oracle = OracleDrafter(plain.sequences[0].tolist(), vocab=97, seed=k)
        out = mtpspec.generate(model, oracle, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences), k
        assert out.stats.rounds < 39


def test_what_the_fused_forward_does_not_cover_runs_op_by_op_and_says_why():
    fp16 = mtpspec.Target(tiny_model("llama").to(torch.float16))
    assert fp16.engine == "torch" and "bf16 or fp32" in fp16.engine_reason()
    qwen3 = mtpspec.Target(tiny_model("qwen3").to(torch.bfloat16))
    assert qwen3.engine == "torch" and "qwen3" in qwen3.engine_reason()
    asked = mtpspec.Target(_model("llama"), engine="torch")
    assert asked.engine == "torch" and "torch" in asked.engine_reason()
    with pytest.raises(mtpspec.InputError, match="engine"):
        mtpspec.Target(_model("llama"), engine="cuda")


def test_a_model_given_new_weights_after_wrapping_is_read_again(each_dtype):
    model = _model("llama", each_dtype)
    t = mtpspec.Target(model)
    ids = torch.randint(4, 97, (1, 12), generator=torch.Generator().manual_seed(7))
    before = t.forward(ids, t.new_cache(64)).logits
    for layer in model.model.layers:  # a weight, a norm: each swapped in
        layer.mlp.gate_proj.weight.data = torch.randn_like(layer.mlp.gate_proj.weight)
        after = t.forward(ids, t.new_cache(64)).logits
        fresh = mtpspec.Target(model).forward(ids, mtpspec.Target(model).new_cache(64)).logits
        assert not torch.equal(before, after) and torch.equal(after, fresh)
        layer.post_attention_layernorm.weight.data = layer.post_attention_layernorm.weight * 2
        again = t.forward(ids, t.new_cache(64)).logits
        assert not torch.equal(again, after)
        assert torch.equal(again, mtpspec.Target(model).forward(ids, mtpspec.Target(model).new_cache(64)).logits)
        before = again


def test_the_library_is_loaded_with_its_entry_points(each_dtype):
    so = fused._loaded(each_dtype)[0]
    for name in ("fused_forward_seqs", "fused_matmul", "fused_init", "head_step_seqs"):
        assert isinstance(getattr(so, name), ctypes._CFuncPtr)


@pytest.mark.parametrize("rows", [1, 3])  # a chain's step; a tree frontier's nodes
def test_the_fused_head_step_computes_what_the_heads_own_step_computes(rows, each_dtype):
    """One draft step as one C call: the next states and the logits over the draft vocabulary and
    a round's extra rows agree with `MTPHead.step` + `project` up to rounding."""
    model = _model("llama", each_dtype)
    tol = TOLERANCE[each_dtype]
    t = mtpspec.Target(model)
    head = mtpspec.MTPHead.for_target(t, mtpspec.HeadConfig(draft_vocab_size=48))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # not the init's zeros and ones
    fast = head.fused_step()
    assert fast is not None
    ids = torch.randint(4, 97, (1, 25), generator=torch.Generator().manual_seed(8))
    cache = t.new_cache(64)
    hidden = t.forward(ids, cache).hidden[:, -rows:]  # (1, R, D): R different states
    state = head.initial_state(hidden)
    tok = ids[:, -rows:]
    cos, sin = head.rope(torch.full((1, rows), 25), state)  # (1, R, hd): one position
    extra = t.lm_head.weight[60:67]  # (7, D): a round's context tokens outside the draft vocabulary
    got_state, got = fast.step(state, tok, cos[0, 0], signed_sin(sin[0, 0]), cache, head.kv_layer, extra)
    keys, values = cache.layer(head.kv_layer)
    want_state = head.step(state, tok, cos, sin, keys, values, None)
    want = head.project(t.final_norm(want_state), extra)[0]
    assert got.shape == want.shape == (rows, 48 + 7) and got_state.shape == want_state.shape
    assert (got_state.float() - want_state.float()).abs().max() <= tol * want_state.float().abs().max()
    assert (got - want.float()).abs().max() <= tol * want.float().abs().max()
    assert torch.equal(got.argmax(-1), want.float().argmax(-1))
    if rows > 1:  # rows are independent: each alone gives its own bits
        for r in range(rows):
            s1, l1 = fast.step(state[:, r:r + 1], tok[:, r:r + 1], cos[0, 0], signed_sin(sin[0, 0]), cache, head.kv_layer, extra)
            assert torch.equal(s1[0, 0], got_state[0, r]) and torch.equal(l1[0], got[r])


def test_a_head_drafting_through_the_fused_step_keeps_the_output_exact(each_dtype):
    model = _model("llama", each_dtype)
    t = mtpspec.Target(model)
    head = mtpspec.MTPHead.for_target(t, mtpspec.HeadConfig())
    assert head.fused_step() is not None
    ids = torch.randint(4, 97, (1, 15), generator=torch.Generator().manual_seed(9))
    plain = mtpspec.generate(t, None, ids, max_new_tokens=30, num_draft_tokens=0, eos_token_id=[])
    out = mtpspec.generate(t, head, ids, max_new_tokens=30, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, plain.sequences)
    tree = mtpspec.generate(t, head, ids, max_new_tokens=30, num_draft_tokens=6, tree=True, eos_token_id=[])
    assert torch.equal(tree.sequences, plain.sequences)
    other = mtpspec.MTPHead.for_target(t, mtpspec.HeadConfig()).to(
        torch.float32 if each_dtype == torch.bfloat16 else torch.bfloat16)  # not in its target's dtype
    assert other.fused_step() is None and "dtype" in fused.head_unsupported(other)


@pytest.mark.parametrize("vocab", [0, 48])  # the whole vocabulary; a draft vocabulary plus the context's tokens
def test_a_greedy_chain_in_one_call_drafts_what_the_steps_draft(vocab, each_dtype, monkeypatch):
    """`FusedHead.chain` (one C call for k drafts) against one C call per step and torch's argmax."""
    t = mtpspec.Target(_model("llama", each_dtype))
    head = mtpspec.MTPHead.for_target(t, mtpspec.HeadConfig(draft_vocab_size=vocab))
    head.copy_context = bool(vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    fast = head.fused_step()
    assert fast is not None and fast.chain_part() is not None
    ids = torch.randint(4, 97, (1, 25), generator=torch.Generator().manual_seed(8))
    cache = t.new_cache(64)
    hidden = t.forward(ids, cache, head.hidden_layers).hidden[:, -1]
    inp = mtpspec.DraftInput(tokens=ids, hidden=hidden, cache=cache)
    one_call = head.propose(inp, 6, mtpspec.SamplingConfig(), None).tokens
    monkeypatch.setattr(type(fast), "chain_part", lambda self: None)  # the step-by-step path
    stepwise = head.propose(inp, 6, mtpspec.SamplingConfig(), None).tokens
    assert torch.equal(one_call, stepwise) and one_call.shape == (6,)


@pytest.mark.parametrize("family", ["mistral", "smollm3"])
def test_sliding_windows_and_nope_layers_run_as_the_torch_path_does(family, each_dtype):
    """Mistral's window and SmolLM3's sliding NoPE layer, across the window: the fused forward
    agrees with the op-by-op one up to rounding, and its greedy text equals its own plain
    decoding with drafts."""
    if family == "mistral":
        model = _model("mistral", each_dtype, sliding_window=8)
    else:
        from conftest import quirky_model

        model = quirky_model("smollm3").to(each_dtype)
    fast, slow = mtpspec.Target(model), mtpspec.Target(model, engine="torch")
    assert fast.engine == "fused" and set(fast.windows) != {None}
    ids = torch.randint(4, 97, (1, 30), generator=torch.Generator().manual_seed(10))
    a = fast.forward(ids, fast.new_cache(64)).logits
    b = slow.forward(ids, slow.new_cache(64)).logits
    assert (a - b).abs().max() <= TOLERANCE[each_dtype] * b.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
    plain = mtpspec.generate(fast, None, ids[:, :5], max_new_tokens=30, num_draft_tokens=0, eos_token_id=[])
    oracle = OracleDrafter(plain.sequences[0].tolist(), vocab=97, seed=1)
    out = mtpspec.generate(fast, oracle, ids[:, :5], max_new_tokens=30, num_draft_tokens=5, eos_token_id=[])
    assert torch.equal(out.sequences, plain.sequences)


def test_rotary_tables_kept_per_run_of_positions_are_the_ones_computed_alone(each_dtype):
    """`FusedForward._rope` keeps a run of positions' (cos, sin): asked again, it returns what the
    model's rotary call gives for those positions alone; a rotary type that rescales with the
    length seen is computed every time."""
    t = mtpspec.Target(tiny_model("llama").to(each_dtype))
    ff = fused.FusedForward(t)
    x = torch.zeros(1, t.hidden_size, dtype=each_dtype)
    for positions in (torch.arange(5, 6), torch.arange(40, 44), torch.tensor([3, 4, 4, 5])):
        cos, sin = t.rope_table(positions[None], x)
        for _ in range(2):  # computed, then (a run) kept
            c, s = ff._rope(positions, x)
            assert torch.equal(c, cos[0].to(each_dtype)) and torch.equal(s, signed_sin(sin[0]).to(each_dtype))
    assert (40, 4) in ff._rope_cache and len(ff._rope_cache) == 2  # the tree's positions are not a run
    t.rotary_emb.rope_type = "dynamic"
    ff._rope_cache.clear()
    ff._rope(torch.arange(7, 9), x)
    assert not ff._rope_cache


def test_the_forward_finds_each_rows_argmax_as_torch_does(each_dtype):
    """The fused forward's argmax of each logits row (found while the logits are finished) is
    torch's: the first of equal largest logits (tokens given the same LM-head row tie exactly)."""
    model = tiny_model("llama").to(each_dtype)
    with torch.no_grad():
        w = model.lm_head.weight
        i = torch.arange(w.shape[0])
        w[:, :] = w[torch.where(i // 16 % 2 == 1, i - 16, i)]  # token i + 16 shares i's row (i // 16 even): all tied
    t = mtpspec.Target(model)
    assert t.engine == "fused"
    ids = torch.randint(0, t.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    out = t.forward(ids, t.new_cache(64))
    assert out.choice is not None and torch.equal(out.choice, out.logits[0].argmax(-1))
    assert bool((out.choice // 16 % 2 == 0).all())  # the first of each tied pair (16 apart: the same vector lane)
