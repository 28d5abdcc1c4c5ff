"""Continuous batching (core/batch.py): a request's output is what it decodes alone, whatever it
is batched with, when it joins or who leaves; greedy (== plain decoding) and sampled with a
seed (== the same request alone, draw for draw). The fused forward's rows of several sequences
equal each sequence alone, up to BATCH_ROWS_MAX rows; a prompt prefilled in chunks equals it in
one piece. The torch engine runs the same batch one sequence after another."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_model
from test_quant_target import quantized_pair

import mtpspec
from mtpspec.config import HeadConfig, SamplingConfig
from mtpspec.core import fused
from mtpspec.core.batch import BATCH_ROWS_MAX, Batch, BatchConfig
from mtpspec.core.drafters import build_drafter
from mtpspec.core.fused import SeqRows
from mtpspec.core.tree import TreeLayout


def _need(dtype: torch.dtype) -> None:
    if (why := fused.reason(dtype)) is not None:
        pytest.skip(f"no fused {dtype} forward here: {why}")


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def target(request):
    _need(request.param)
    t = mtpspec.Target(tiny_model("llama").to(request.param))
    assert t.engine == "fused"
    return t


def _head(target, seed: int = 0, draft_vocab: int = 0):
    """A fresh head; draft_vocab > 0: a reduced draft vocabulary, so that each request's round
    also scores its own context tokens outside it (`round_vocab`: extra rows that differ per request)."""
    torch.manual_seed(seed)
    return mtpspec.MTPHead.for_target(target.model, HeadConfig(draft_vocab_size=draft_vocab)).to(target.dtype)


def _prompts(n: int, vocab: int, seed: int = 0, lo: int = 3, hi: int = 40) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, int(torch.randint(lo, hi, (1,), generator=g))), generator=g) for _ in range(n)]


def _run(batch: Batch, requests: list[dict], seed: int = 0) -> dict[int, list[int]]:
    """Requests join at random steps (random arrival order and times); returns each request's
    new tokens by index, checking that every round's tokens arrive in order."""
    rng = random.Random(seed)
    pending = list(enumerate(requests))
    rng.shuffle(pending)
    slots, seen = {}, {}
    while pending or any(not s.done for s in slots.values()):
        for _ in range(rng.randrange(3) if pending else 0):
            if pending:
                i, req = pending.pop()
                slots[i] = batch.add(**req)
                seen[i] = []
        for s, rnd in batch.step():
            i = next(j for j, sl in slots.items() if sl is s)
            seen[i] += list(rnd.tokens)
            if s.done:
                batch.remove(s)
        assert batch.rows_last <= batch.config.max_rows
    for i, s in slots.items():
        assert seen[i] == s.state.new_tokens
    return seen


def test_greedy_requests_in_a_batch_equal_plain_decoding_alone(target):
    head = _head(target, draft_vocab=40)
    prompts = _prompts(7, target.vocab_size)
    reqs = [dict(input_ids=p, max_new_tokens=6 + 3 * i, drafter=head if i % 3 else None, k=1 + i % 4)
            for i, p in enumerate(prompts)]
    got = _run(Batch(target, BatchConfig(max_rows=24, prefill_rows=8)), reqs)
    for i, r in enumerate(reqs):
        plain = mtpspec.generate(target, None, r["input_ids"], r["max_new_tokens"], num_draft_tokens=0)
        assert got[i] == plain.sequences[0, r["input_ids"].shape[1]:].tolist(), i


def test_seeded_sampled_requests_in_a_batch_equal_themselves_alone(target):
    head = _head(target)
    prompts = _prompts(6, target.vocab_size, seed=1)
    settings = [SamplingConfig(temperature=1.0, seed=10 + i, top_k=0 if i % 2 else 20) for i in range(6)]
    reqs = [dict(input_ids=p, max_new_tokens=10, drafter=head, k=2 + i % 3, sampling=s)
            for i, (p, s) in enumerate(zip(prompts, settings))]
    for order_seed in (0, 1):  # two arrival orders, the same outputs
        got = _run(Batch(target, BatchConfig(max_rows=16, prefill_rows=4)), reqs, seed=order_seed)
        for i, (r, s) in enumerate(zip(reqs, settings)):
            alone = mtpspec.generate(target, head, r["input_ids"], 10, num_draft_tokens=r["k"], temperature=1.0,
                                     top_k=s.top_k, seed=s.seed)
            assert got[i] == alone.sequences[0, r["input_ids"].shape[1]:].tolist(), (order_seed, i)


def test_a_request_that_leaves_mid_flight_changes_no_other(target):
    head = _head(target)
    prompts = _prompts(4, target.vocab_size, seed=2)
    batch = Batch(target, BatchConfig(max_rows=32))
    slots = [batch.add(p, 12, head, 3) for p in prompts]
    for _ in range(3):
        batch.step()
    batch.remove(slots[1])  # cancelled: its cache goes with it
    while any(not s.done for s in batch.slots):
        batch.step()
    for i in (0, 2, 3):
        plain = mtpspec.generate(target, None, prompts[i], 12, num_draft_tokens=0)
        assert slots[i].state.new_tokens == plain.sequences[0, prompts[i].shape[1]:].tolist()


def test_tree_and_switch_drafters_per_request_in_a_batch(target):
    head = _head(target)
    prompts = _prompts(3, target.vocab_size, seed=3)
    batch = Batch(target, BatchConfig(max_rows=BATCH_ROWS_MAX))
    slots = []
    for p, kind in zip(prompts, ("tree", "switch", "chain")):
        drafter, k = build_drafter(head, kind, k=5)
        slots.append(batch.add(p, 10, drafter, k))
    while any(not s.done for s in batch.slots):
        batch.step()
    for p, s in zip(prompts, slots):
        assert s.state.new_tokens == mtpspec.generate(target, None, p, 10, num_draft_tokens=0).sequences[0, p.shape[1]:].tolist()


def test_rows_of_several_sequences_equal_each_sequence_alone_up_to_the_row_cap(target):
    """Chains, a tree and prompt chunks in one forward of BATCH_ROWS_MAX rows."""
    g = torch.Generator().manual_seed(4)
    contexts = [torch.randint(0, target.vocab_size, (1, n), generator=g) for n in (5, 17, 30, 9)]
    parents = [-1, 0, 0, 1, 1, 2, 5]  # a tree of 7 nodes under the last token

    def fresh():
        caches = [target.new_cache(128) for _ in contexts]
        for c, ids in zip(caches, contexts):
            target.forward(ids, c)
        return caches

    new = [torch.randint(0, target.vocab_size, (1, n), generator=g) for n in (16, 8, 1 + len(parents))]
    rest = BATCH_ROWS_MAX - sum(x.shape[1] for x in new)
    new.append(torch.randint(0, target.vocab_size, (1, rest), generator=g))  # a prompt chunk
    layouts = [None, None, TreeLayout.from_parents(parents), None]
    alone, caches_alone = [], fresh()
    for ids, c, lay in zip(new, caches_alone, layouts):
        alone.append(target.forward(ids, c, (-2, -1), layout=lay))
    caches = fresh()
    together = target.forward_many([SeqRows(ids, c, layout=lay) for ids, c, lay in zip(new, caches, layouts)], (-2, -1))
    assert sum(x.shape[1] for x in new) == BATCH_ROWS_MAX
    for a, b, ca, cb in zip(alone, together, caches_alone, caches):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
        assert ca.length == cb.length
        assert torch.equal(ca.keys[:, :, :ca.length], cb.keys[:, :, :cb.length])


def test_a_prompt_prefilled_in_chunks_equals_it_in_one_piece(target):
    ids = torch.randint(0, target.vocab_size, (1, 77), generator=torch.Generator().manual_seed(5))
    whole = target.new_cache(128)
    a = target.forward(ids, whole, logits_to_keep=1)
    chunked = target.new_cache(128)
    for lo in range(0, 77, 13):
        b = target.forward(ids[:, lo:lo + 13], chunked, logits_to_keep=1)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden[:, -1], b.hidden[:, -1])
    assert torch.equal(whole.keys[:, :, :77], chunked.keys[:, :, :77])


@pytest.mark.parametrize("draft_vocab", [0, 40], ids=["full-vocabulary", "reduced-plus-context"])
def test_the_head_drafts_for_many_requests_as_it_drafts_for_each(target, draft_vocab, monkeypatch):
    head = _head(target, draft_vocab=draft_vocab)
    from mtpspec.core.decode import prefill
    from mtpspec.core.draft import DraftInput
    states = [prefill(target, p, 20, head.hidden_layers)[0] for p in _prompts(5, target.vocab_size, seed=6)]
    inps = [DraftInput(s.tokens, s.hidden, s.cache) for s in states]
    if draft_vocab:  # every request's round adds its own number of context tokens
        extras = [head.round_vocab(i.tokens)[1] for i in inps]
        assert len({0 if e is None else e.shape[0] for e in extras}) > 1
    ks = [1, 4, 2, 4, 3]
    greedy = SamplingConfig()
    many = head.propose_many(inps, ks, [greedy] * 5, [None] * 5)
    for inp, k, d in zip(inps, ks, many):
        assert torch.equal(d.tokens, head.propose(inp, k, greedy, None).tokens)
    # the greedy chains as one C call (`FusedHead.chain_many`) give what one call per depth gives
    fast = head.fused_step()
    assert fast is not None and fast.chain_part() is not None
    with monkeypatch.context() as m:
        m.setattr(type(fast), "chain_part", lambda self: None)
        stepwise = head.propose_many(inps, ks, [greedy] * 5, [None] * 5)
    assert [d.tokens.tolist() for d in many] == [d.tokens.tolist() for d in stepwise]
    assert [len(d.tokens) for d in many] == ks
    sampled = SamplingConfig(temperature=0.8, seed=3)
    gens = [torch.Generator().manual_seed(i) for i in range(5)]
    many = head.propose_many(inps, ks, [sampled] * 5, gens)
    for i, (inp, k, d) in enumerate(zip(inps, ks, many)):
        one = head.propose(inp, k, sampled, torch.Generator().manual_seed(i))
        assert torch.equal(d.tokens, one.tokens) and torch.equal(d.q, one.q)


@pytest.mark.parametrize("qtype", [3, 8, 12], ids=["Q4_1", "Q8_0", "Q4_K"])
def test_a_batch_on_quantized_blocks_equals_plain_decoding(qtype):
    _need(torch.bfloat16)
    t = mtpspec.Target(quantized_pair(qtype, torch.bfloat16)[1])
    head = _head(t)
    prompts = _prompts(5, t.vocab_size, seed=7)
    got = _run(Batch(t, BatchConfig(max_rows=20, prefill_rows=6)), [dict(input_ids=p, max_new_tokens=8, drafter=head, k=3)
                                                                      for p in prompts])
    for i, p in enumerate(prompts):
        assert got[i] == mtpspec.generate(t, None, p, 8, num_draft_tokens=0).sequences[0, p.shape[1]:].tolist()


def test_prompts_that_share_a_prefix_copy_it_and_decode_as_alone(target):
    """A request whose prompt begins with what another (running or finished and kept) has
    committed copies those keys and values instead of prefilling them: greedy and seeded
    sampled outputs equal each request alone, and the copies did happen."""
    head = _head(target)
    g = torch.Generator().manual_seed(3)
    common = torch.randint(0, target.vocab_size, (1, 30), generator=g)
    firsts = [torch.cat([common, torch.randint(0, target.vocab_size, (1, 2 + 5 * i), generator=g)], 1) for i in range(4)]
    firsts.append(firsts[2].clone())  # the same prompt twice: all but its last id copied
    sampled = SamplingConfig(temperature=1.0, seed=4)

    def alone(ids: torch.Tensor, n: int, sampling: SamplingConfig | None) -> list[int]:
        kw = dict(temperature=1.0, seed=sampling.seed) if sampling else {}
        out = mtpspec.generate(target, head, ids, n, num_draft_tokens=2 if sampling else 0, **kw)
        return out.sequences[0, ids.shape[1]:].tolist()

    batch = Batch(target, BatchConfig(max_rows=24, prefill_rows=8, prefix_keep=5))
    reqs = [dict(input_ids=p, max_new_tokens=8, drafter=head, k=2, sampling=sampled if i == 1 else None)
            for i, p in enumerate(firsts)]
    got = _run(batch, reqs)
    for i, r in enumerate(reqs):
        assert got[i] == alone(r["input_ids"], 8, r["sampling"]), i
    first_round = batch.reused_tokens
    assert first_round >= 30, "the later prompts found the common prefix of the running ones"
    # follow-ups: a finished request's prompt and answer, then more (its kept cache is read)
    follow = [torch.cat([firsts[i], torch.tensor([got[i]]), torch.randint(0, target.vocab_size, (1, 3), generator=g)], 1)
              for i in (0, 3)]
    reqs2 = [dict(input_ids=p, max_new_tokens=6, drafter=head, k=2) for p in follow]
    got2 = _run(batch, reqs2, seed=1)
    for i, r in enumerate(reqs2):
        assert got2[i] == alone(r["input_ids"], 6, None), i
    assert batch.reused_tokens - first_round >= sum(p.shape[1] - 4 for p in follow)


def test_a_cache_copy_from_another_model_or_beyond_its_length_is_refused(target):
    from mtpspec.core.cache import KVCache
    mine = target.new_cache(64)
    N, Hk, _, hd = mine.keys.shape
    other = KVCache(keys=torch.zeros(N, Hk, 64, hd + 2), values=torch.zeros(N, Hk, 64, hd + 2), length=10)
    with pytest.raises(mtpspec.InputError, match="same target"):
        mine.copy_prefix(other, 5)
    short = target.new_cache(64)
    short.length = 3
    with pytest.raises(mtpspec.InputError, match="same target"):
        mine.copy_prefix(short, 5)


def test_the_torch_engine_runs_a_batch_one_sequence_after_another():
    t = mtpspec.Target(tiny_model("llama"), engine="torch")
    head = _head(t)
    prompts = _prompts(4, t.vocab_size, seed=8)
    prompts.append(prompts[0].clone())  # a shared prompt: the torch engine prefills it again (never copies)
    batch = Batch(t, BatchConfig(prefix_keep=4))
    got = _run(batch, [dict(input_ids=p, max_new_tokens=7, drafter=head, k=2) for p in prompts])
    assert batch.reused_tokens == 0
    for i, p in enumerate(prompts):
        assert got[i] == mtpspec.generate(t, None, p, 7, num_draft_tokens=0).sequences[0, p.shape[1]:].tolist()


def test_bad_batch_settings_are_refused_with_reasons(llama):
    with pytest.raises(mtpspec.InputError, match="max_rows"):
        BatchConfig(max_rows=BATCH_ROWS_MAX + 1)
    with pytest.raises(mtpspec.InputError, match="prefill_rows"):
        BatchConfig(max_rows=8, prefill_rows=9)
    batch = Batch(mtpspec.Target(llama), BatchConfig(max_rows=4, prefill_rows=2))
    with pytest.raises(mtpspec.InputError, match="k = 4"):
        batch.add(torch.tensor([[1, 2]]), 5, mtpspec.MTPHead.for_target(llama), 4)
    with pytest.raises(mtpspec.InputError, match="max_new_tokens"):
        batch.add(torch.tensor([[1, 2]]), 0)
    assert len(batch) == 0


def test_drafts_follow_the_load_except_for_seeded_samples(target):
    """With 4 requests and draft_rows 8, each may draft 8 // 4 - 1 = 1 token a round, except the
    one sampled with a seed, which drafts its own k = 3; every output stays what it is alone."""
    head = _head(target)
    prompts = _prompts(4, target.vocab_size, seed=9, lo=3, hi=6)
    batch = Batch(target, BatchConfig(max_rows=32, prefill_rows=16, draft_rows=8))
    seeded = SamplingConfig(temperature=1.0, seed=5)
    slots = [batch.add(p, 12, head, 3, seeded if i == 0 else None) for i, p in enumerate(prompts)]
    batch.step()  # every prompt fits one forward
    assert all(s.running for s in slots)
    batch.step()
    assert batch.rows_last == (3 + 1) + 3 * (1 + 1)
    while any(not s.done for s in batch.slots):
        batch.step()
    alone = mtpspec.generate(target, head, prompts[0], 12, num_draft_tokens=3, temperature=1.0, seed=5)
    assert slots[0].state.new_tokens == alone.sequences[0, prompts[0].shape[1]:].tolist()
    for p, s in zip(prompts[1:], slots[1:]):
        assert s.state.new_tokens == mtpspec.generate(target, None, p, 12).sequences[0, p.shape[1]:].tolist()
