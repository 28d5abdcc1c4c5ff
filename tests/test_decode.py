"""The decode loop is lossless: speculative greedy output equals HF greedy output, token for
token, for every supported family, draft length, prompt length, EOS and max_new_tokens cut."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, OracleDrafter, hf_greedy, tiny_model

import mtpspec
from mtpspec.core.drafters import TreeDrafter


def _prompt(length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 97, (1, length), generator=g)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_head_greedy_equals_hf_greedy(family, k):
    model = tiny_model(family)
    head = mtpspec.MTPHead.for_target(model)
    for length in (1, 7, 300):
        ids = _prompt(length, seed=length)
        ref = hf_greedy(model, ids, 30, eos=[])
        out = mtpspec.generate(model, head, ids, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, ref), (family, k, length)
        assert out.stats.new_tokens == 30


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_oracle_with_errors_equals_hf_greedy(family, k):
    """An oracle that proposes the true continuation with errors at random offsets exercises
    every acceptance length and every rollback offset."""
    model = tiny_model(family)
    hist = [0] * (k + 1)
    for seed, length in enumerate((1, 5, 40, 200)):
        ids = _prompt(length, seed)
        ref = hf_greedy(model, ids, 64, eos=[])
        oracle = OracleDrafter(ref[0].tolist(), vocab=97, seed=seed)
        out = mtpspec.generate(model, oracle, ids, max_new_tokens=64, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, ref), (family, k, length)
        hist = [a + b for a, b in zip(hist, out.stats.accept_hist)]
    # every acceptance length 0..k occurred at least once across the prompts
    assert all(h > 0 for h in hist), hist


def test_perfect_oracle_accepts_everything():
    model = tiny_model("llama")
    ids = _prompt(9, 0)
    ref = hf_greedy(model, ids, 41, eos=[])
    out = mtpspec.generate(model, OracleDrafter(ref[0].tolist(), 97, inject=False), ids, max_new_tokens=41,
                           num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    # 1 prefill token + 8 rounds of 5 tokens
    assert out.stats.rounds == 8 and out.stats.mean_accepted == 5.0
    assert out.stats.target_forwards == 9


def _eos_case():
    """A prompt and an EOS id that its greedy continuation first emits at offset >= 3: the
    token found there is declared the EOS (also in the model's generation config)."""
    model = tiny_model("llama")
    ids = _prompt(6, 0)
    cont = hf_greedy(model, ids, 40, eos=[])[0, 6:].tolist()
    at = next(i for i in range(3, 40) if cont[i] not in cont[:i])
    model.generation_config.eos_token_id = cont[at]
    return model, ids, at, cont[at]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_eos_inside_an_accepted_run(k):
    model, ids, at, eos = _eos_case()
    ref = hf_greedy(model, ids, 40, eos=eos)
    assert ref.shape[1] == 6 + at + 1 and ref[0, -1] == eos
    full = hf_greedy(model, ids, 40, eos=[])[0].tolist()
    # The oracle proposes past the EOS: generation must still stop right after it.
    for eos_arg in (eos, [eos, 96], None):  # an int, a list, the generation config's default
        out = mtpspec.generate(model, OracleDrafter(full, 97, inject=False), ids, max_new_tokens=40,
                               num_draft_tokens=k, eos_token_id=eos_arg)
        assert torch.equal(out.sequences, ref), eos_arg


@pytest.mark.parametrize("max_new", [1, 2, 5, 6, 7, 13])
def test_max_new_tokens_reached_mid_draft(max_new):
    model = tiny_model("qwen2")
    ids = _prompt(8, 1)
    ref = hf_greedy(model, ids, max_new, eos=[])
    out = mtpspec.generate(model, OracleDrafter(ref[0].tolist() + [0] * 20, 97, inject=False), ids,
                           max_new_tokens=max_new, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    assert out.stats.new_tokens == max_new
    # a perfect oracle: every position that was checked passed, even in capped final rounds
    assert all(r == 1.0 for r, c in zip(out.stats.position_acceptance, out.stats.pos_checked) if c)


@pytest.mark.parametrize("tree", [False, True])
def test_each_round_says_which_of_its_tokens_were_accepted_drafts(tree):
    """What streaming needs from `step`: the rounds, joined, are the new tokens; in each, the
    accepted drafts come first, as many as the stats count, then the target's own token (unless
    max_new_tokens cut it); a round reads as the list of its ids."""
    model = tiny_model("llama")
    ids = _prompt(7, 5)
    ref = hf_greedy(model, ids, 33, eos=[])
    t = mtpspec.Target(model)
    oracle = OracleDrafter(ref[0].tolist(), vocab=97, seed=3)
    drafter = TreeDrafter(mtpspec.MTPHead.for_target(t)) if tree else oracle
    state, first = mtpspec.prefill(t, ids, 33, drafter.hidden_layers, eos_token_id=[], num_draft_tokens=4)
    assert isinstance(first, mtpspec.Round) and first.drafted == (False,) and first.accepted == 0
    rounds = [first]
    while not state.done:
        passed = sum(state.stats.pos_passed)
        r = mtpspec.step(t, drafter, state, 4)
        assert r.accepted == sum(state.stats.pos_passed) - passed
        assert r.drafted == (True,) * r.accepted + (False,) * (len(r) - r.accepted) and len(r) - r.accepted <= 1
        assert list(r) == list(r.tokens) and r[-1] == r.tokens[-1] and len(r) >= 1
        rounds.append(r)
    assert [tok for r in rounds for tok in r] == state.new_tokens == ref[0, 7:].tolist()
    assert sum(r.accepted for r in rounds) > 0  # some drafts were accepted, so the flags were tested
    assert len(mtpspec.step(t, drafter, state, 4)) == 0  # done: an empty round


def test_k_zero_is_plain_decoding():
    model = tiny_model("llama")
    ids = _prompt(5, 2)
    ref = hf_greedy(model, ids, 20, eos=[])
    for drafter in (None, mtpspec.MTPHead.for_target(model)):
        out = mtpspec.generate(model, drafter, ids, max_new_tokens=20, num_draft_tokens=0, eos_token_id=[])
        assert torch.equal(out.sequences, ref)
        assert out.stats.mean_accepted == 1.0 and out.stats.target_forwards == 20


def test_target_weights_bit_identical_after_generation():
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    head = mtpspec.MTPHead.for_target(model)
    mtpspec.generate(model, head, _prompt(10, 3), max_new_tokens=20, num_draft_tokens=3)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not any(p.requires_grad for p in model.parameters())


def test_stats_are_consistent():
    model = tiny_model("llama")
    ids = _prompt(5, 4)
    ref = hf_greedy(model, ids, 30, eos=[])
    out = mtpspec.generate(model, OracleDrafter(ref[0].tolist(), 97, seed=1), ids, max_new_tokens=30,
                           num_draft_tokens=3, eos_token_id=[])
    s = out.stats
    assert sum(s.accept_hist) == s.rounds == s.target_forwards - 1
    assert s.new_tokens == 30
    assert s.mean_accepted == pytest.approx(sum((n + 1) * c for n, c in enumerate(s.accept_hist)) / s.rounds)
    assert len(s.position_acceptance) == 3 and all(0 <= r <= 1 for r in s.position_acceptance)
    # the conditional rates multiply back to the histogram's survival counts
    for i in range(3):
        assert s.pos_passed[i] == sum(s.accept_hist[i + 1:])
    assert s.draft_s > 0 and s.verify_s > 0 and s.prefill_s > 0  # every phase was timed
    assert s.to_dict()["mean_accepted"] == round(s.mean_accepted, 4) > 1.0


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(2, 4, dtype=torch.long), "batch size 1"),
        (torch.zeros(1, 0, dtype=torch.long), "T >= 1"),
        (torch.full((1, 3), 500), "outside the target's vocabulary"),
        (torch.zeros(1, 3), "integer"),
    ],
)
def test_bad_input_raises_clear_error(bad, match):
    model = tiny_model("llama")
    with pytest.raises(mtpspec.InputError, match=match):
        mtpspec.generate(model, None, bad, max_new_tokens=3)


def test_bad_settings_raise_clear_error():
    model = tiny_model("llama")
    ids = _prompt(3, 0)
    with pytest.raises(mtpspec.InputError, match="max_new_tokens"):
        mtpspec.generate(model, None, ids, max_new_tokens=0)
    with pytest.raises(mtpspec.InputError, match="num_draft_tokens"):
        mtpspec.generate(model, None, ids, num_draft_tokens=-1)
    with pytest.raises(mtpspec.InputError, match="temperature"):
        mtpspec.generate(model, None, ids, temperature=-1.0)


def test_drafter_breaking_the_protocol_is_refused():
    class Long:
        hidden_layers = (-1,)

        def propose(self, inp, k, sampling, generator):
            return mtpspec.Draft(tokens=torch.zeros(k + 1, dtype=torch.long))

        def update(self, drafted, accepted):
            pass

    class NoFeedback:
        hidden_layers = (-1,)

        def propose(self, inp, k, sampling, generator):
            return mtpspec.Draft(tokens=torch.zeros(k, dtype=torch.long))

    with pytest.raises(mtpspec.InputError, match="expected"):
        mtpspec.generate(tiny_model("llama"), Long(), _prompt(4, 0), max_new_tokens=8, num_draft_tokens=3)
    with pytest.raises(mtpspec.InputError, match="update"):
        mtpspec.generate(tiny_model("llama"), NoFeedback(), _prompt(4, 0), max_new_tokens=8, num_draft_tokens=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_speculative_equals_plain_decoding_bit_for_bit(family, dtype):
    """A verify pass over k + 1 rows must give exactly the logits of k + 1 one-row passes
    (row-invariant kernels, attention over all slots), so drafting never changes a token:
    every acceptance length against plain decoding in the same dtype. (fp32 where this
    machine's plan is row-invariant: see `test_chosen_kernels_are_row_invariant`.)"""
    model = tiny_model(family).to(dtype)
    if not mtpspec.Target(model).plan.row_invariant:
        pytest.skip("no row-invariant fp32 kernels on this machine (see test_chosen_kernels_are_row_invariant)")
    for seed, length in enumerate((1, 13, 150)):
        ids = _prompt(length, seed)
        plain = mtpspec.generate(model, None, ids, max_new_tokens=48, num_draft_tokens=0, eos_token_id=[])
        for k in (1, 3, 6):
            oracle = OracleDrafter(plain.sequences[0].tolist(), vocab=97, seed=seed + k)
            out = mtpspec.generate(model, oracle, ids, max_new_tokens=48, num_draft_tokens=k, eos_token_id=[])
            assert torch.equal(out.sequences, plain.sequences), (family, length, k)
            assert out.stats.rounds < 47  # drafts were accepted, so rows really ran together


def test_chosen_kernels_are_row_invariant():
    """The plan picked on this machine computes a row alone exactly as among others. bf16 must
    have such kernels (the exactness the README promises), and so must fp32 wherever mtpspec's
    own C kernels run (x86-64 with AVX2 + FMA and a C compiler): torch's fp32 kernels alone
    may have none (on an AMD EPYC, Zen 3 and Zen 4, no MKL path rounded a row the same at
    every row count), and only then may the plan say row_invariant=False."""
    from mtpspec.core import native
    from mtpspec.core.kernels import attention, linear

    for dtype in (torch.float32, torch.bfloat16):
        t = mtpspec.Target(tiny_model("llama").to(dtype))
        plan = t.plan
        if dtype == torch.float32 and not plan.row_invariant:
            assert native.library() is None, f"fp32 plan {plan} is not row-invariant though the native kernels load"
            continue
        assert plan.row_invariant, plan
        g = torch.Generator().manual_seed(0)
        w = torch.randn(64, 32, generator=g).to(dtype)
        x = torch.randn(9, 32, generator=g).to(dtype)
        together = linear(x, w, None, plan.linear)
        assert all(torch.equal(linear(x[i:i + 1], w, None, plan.linear), together[i:i + 1]) for i in range(9))
        q = torch.randn(1, 4, 9, 8, generator=g).to(dtype)
        kv = torch.randn(1, 2, 64, 8, generator=g).to(dtype)
        mask = torch.arange(64)[None, :] <= torch.arange(40, 49)[:, None]
        both = attention(q, kv, kv, mask, 8**-0.5, plan.attention)
        assert all(torch.equal(attention(q[:, :, i:i + 1], kv, kv, mask[i:i + 1], 8**-0.5, plan.attention),
                               both[:, :, i:i + 1]) for i in range(9))


def test_overlong_request_is_refused():
    model = tiny_model("llama")  # max_position_embeddings = 1024
    with pytest.raises(mtpspec.InputError, match="1024 positions"):
        mtpspec.generate(model, None, _prompt(1000, 0), max_new_tokens=100, num_draft_tokens=0)


def test_more_drafts_than_the_checked_verify_rows_are_refused():
    from mtpspec.core.kernels import R_MAX

    model = tiny_model("llama")
    with pytest.raises(mtpspec.InputError, match=f"0..{R_MAX - 1}"):
        mtpspec.generate(model, mtpspec.MTPHead.for_target(model), _prompt(3, 0), num_draft_tokens=R_MAX)
