"""Training: the target stays frozen, training-time predictions equal decode-time drafts, the
head can overfit, a killed run resumes exactly, and 2 DDP processes follow 1 process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from copy import deepcopy
from pathlib import Path

import pytest
import torch
from conftest import tiny_model, write_tiny_data

import mtpspec
from mtpspec import DraftInput, HeadConfig, MTPHead, SamplingConfig, Target
from mtpspec.config import TrainConfig
from mtpspec.errors import DataError, InputError
from mtpspec.training import train as train_mod
from mtpspec.training.activations import Sample, build_cache, load_cache, token_frequencies
from mtpspec.training.train import MTPObjective, collate, round_roots, train

# Short runs with a fixed schedule: exactly `epochs` passes (min_steps=0), warm-up warmup_steps.
FAST = dict(batch_size=8, lr=3e-3, warmup_steps=2, eval_every=1000, save_every=1000, bf16=False, max_draft_tokens=3,
            min_steps=0, warmup_fraction=1.0)


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_training_leaves_the_target_bit_identical(tiny_run, tmp_path):
    model, root = tiny_run
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train(Target(model), root / "act", tmp_path, TrainConfig(epochs=1, **FAST), progress=False)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    assert (tmp_path / "head" / "mtp_head.safetensors").is_file()


def test_train_time_predictions_equal_inference_drafts(tiny_run):
    """Row t of the training unroll, fed the head's own drafts, reproduces those drafts."""
    model, _ = tiny_run
    target = Target(model)
    torch.manual_seed(1)
    head = MTPHead.for_target(model, HeadConfig(hidden_layers=(-2, -1), num_blocks=2))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    K = 4
    prefix = torch.randint(4, 97, (1, 12))
    for t in (0, 5, 10):  # the last verified position
        cache = target.new_cache()
        step = target.forward(prefix[:, : t + 1], cache, head.config.hidden_layers)
        nxt = prefix[:, t + 1: t + 2]
        d = head.propose(DraftInput(torch.cat([prefix[:, : t + 1], nxt], 1), step.hidden[:, -1], cache), K,
                         SamplingConfig(), None)
        seq = torch.cat([prefix[:, : t + 2], d.tokens[None]], 1)  # (1, t + 2 + K)
        full_cache = target.new_cache()
        full = target.forward(seq, full_cache, head.config.hidden_layers)
        keys, values = full_cache.layer(head.kv_layer)
        with torch.no_grad():
            logits = head(full.hidden, seq, keys, values, K)
        train_drafts = [int(lg[0, t].argmax()) for _, lg in logits]
        assert train_drafts == d.tokens.tolist(), t
        # computing only the rows from t on gives the same rows, as does any (B, R) choice of rows
        with torch.no_grad():
            part = head(full.hidden, seq, keys, values, K, rows=t)
            picked = head(full.hidden, seq, keys, values, K, rows=torch.tensor([[t, 1, t + 1]]))
        assert all(torch.allclose(a[1][:, t:], b[1], atol=1e-5) for a, b in zip(logits, part))
        assert all(torch.allclose(a[1][:, [t, 1, t + 1]], b[1], atol=1e-5) for a, b in zip(logits, picked))


def test_copy_vocabulary_in_training_equals_drafting_with_copy_context():
    """--copy-context: row t of the training unroll scores the draft vocabulary plus exactly the
    context tokens drafting at root t may copy (x_0..x_{t+1}), so its drafts equal the head's
    own drafts with `copy_context`, including a copied token outside the draft vocabulary."""
    model = tiny_model("llama")
    target = Target(model)
    torch.manual_seed(2)
    head = MTPHead.for_target(model, HeadConfig(draft_vocab_size=8), draft_ids=torch.arange(4, 12))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    K = 3
    obj = MTPObjective(head, TrainConfig(max_draft_tokens=K, bf16=False, copy_context=True))
    prefix = torch.randint(20, 97, (1, 14))  # every token outside the draft vocabulary 4..11
    copied = 0
    for t in range(2, 11):  # the last verified position
        cache = target.new_cache()
        step = target.forward(prefix[:, : t + 1], cache, head.config.hidden_layers)
        ctx = prefix[:, : t + 2]
        d = head.propose(DraftInput(ctx, step.hidden[:, -1], cache), K, SamplingConfig(), None)
        seq = torch.cat([ctx, d.tokens[None]], 1)  # (1, t + 2 + K)
        full_cache = target.new_cache()
        full = target.forward(seq, full_cache, head.config.hidden_layers)
        keys, values = full_cache.layer(head.kv_layer)
        batch = {"ids": seq, "lengths": torch.tensor([seq.shape[1]]), "prompt_lens": torch.tensor([1])}
        vocab = obj.batch_vocab(batch, torch.arange(seq.shape[1]).unsqueeze(0))
        with torch.no_grad():
            logits = vocab.mask(head(full.hidden, seq, keys, values, K, 0, vocab.extra_rows))
        train_drafts = [int(vocab.ids[lg[0, t].argmax()]) for _, lg in logits]
        assert train_drafts == d.tokens.tolist(), t
        # row t may draft the context's tokens and no later one
        col = {int(i): c for c, i in enumerate(vocab.ids.tolist())}
        allowed = {int(x) for x in ctx[0]} | set(range(4, 12))
        finite = {int(vocab.ids[c]) for c in torch.isfinite(logits[0][1][0, t]).nonzero()[:, 0]}
        assert finite == allowed and all(x in col for x in allowed)
        copied += sum(x not in range(4, 12) for x in d.tokens.tolist())
    assert copied > 0  # the check covered drafts outside the draft vocabulary


def _uneven(samples):
    """The samples cut to different lengths and answer starts (prompt lengths 2..12)."""
    out = []
    for i, s in enumerate(samples):
        n, pl = s.ids.shape[0] - 3 * i, 2 + 5 * (i % 3)
        out.append(Sample(s.ids[:n], pl, s.hidden[:n], s.keys[:, :n], s.values[:, :n], s.top_logp[:n], s.top_ids[:n]))
    return out


def test_a_batch_computes_each_answers_rows_as_that_answer_alone(tiny_run, monkeypatch):
    """Sequences whose answers start and end at different places: each computes its own rows
    (`answer_rows`), and the padded batch's loss is the sum of the sequences' losses alone, with
    every loss term on, and equals computing every row of every sequence. Acceptance does not
    depend on the batching either."""
    model, root = tiny_run
    samples = _uneven(load_cache(root / "act")[:6])
    assert len({s.prompt_len for s in samples}) == 3 and len({s.ids.shape[0] for s in samples}) == 6
    torch.manual_seed(0)
    head = MTPHead(Target(model), HeadConfig(), draft_ids=torch.arange(0, 64)).float()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    batch = collate(samples)

    def every_row(b, before):
        return torch.arange(b["ids"].shape[1]).expand(len(b["ids"]), -1)

    with torch.no_grad():
        for K in (1, 3):
            obj = MTPObjective(head, TrainConfig(max_draft_tokens=K, bf16=False, round_weight=1.0, tv_weight=0.5,
                                                 copy_context=True))
            together, n = obj.loss(head, batch)
            alone = [obj.loss(head, collate([s])) for s in samples]
            assert n == sum(m for _, m in alone) > 0
            assert float(together) == pytest.approx(sum(float(x) for x, _ in alone), rel=1e-5)
            acc = obj.acceptance(samples, 6)
            assert acc == pytest.approx(obj.acceptance(samples, 1), rel=1e-6)
            walks = [w for s in samples for _, ws in obj.round_walks([s], 1) for w in ws]  # one per sample
            assert sorted(w for _, ws in obj.round_walks(samples, 6) for w in ws) == sorted(walks)
            assert all(0 < sum(a + 1 for a in w) <= s.ids.shape[0] - s.prompt_len for s, w in zip(samples, walks))
            tokens, rounds = sum(a + 1 for w in walks for a in w), sum(map(len, walks))
            assert acc["accept_rounds"] == pytest.approx(tokens / rounds)
            with monkeypatch.context() as m:
                m.setattr(train_mod, "answer_rows", every_row)
                every, n_every = obj.loss(head, batch)
                assert obj.acceptance(samples, 6) == pytest.approx(acc, rel=1e-6)
            assert n_every == n and float(every) == pytest.approx(float(together), rel=1e-5)


def test_samples_whose_prompt_fills_the_cache_add_nothing_and_break_nothing(tiny_run):
    """A prompt longer than the cache's max_len leaves a sample with no answer token. Alone or
    in a batch made only of such samples it adds no rows and a zero loss (a part of a batch on
    long passages once crashed on it); beside other samples it changes nothing."""
    model, root = tiny_run
    samples = _uneven(load_cache(root / "act")[:4])
    cut = [Sample(s.ids[:n], n + extra, s.hidden[:n], s.keys[:, :n], s.values[:, :n], s.top_logp[:n], s.top_ids[:n])
           for s, n, extra in zip(samples[:3], (5, 9, 12), (5, 8, 30))]
    torch.manual_seed(0)
    head = MTPHead(Target(model), HeadConfig(), draft_ids=torch.arange(0, 64)).float()
    for K in (1, 3):
        obj = MTPObjective(head, TrainConfig(max_draft_tokens=K, bf16=False, round_weight=1.0, tv_weight=0.5,
                                             copy_context=True))
        with torch.no_grad():
            none, n_none = obj.loss(head, collate(cut))
            mixed, n_mixed = obj.loss(head, collate(cut + samples))
            alone, n_alone = obj.loss(head, collate(samples))
        assert n_none == 0 and float(none) == 0.0
        assert n_mixed == n_alone > 0 and float(mixed) == pytest.approx(float(alone), rel=1e-5)
        obj.acceptance(cut + samples, 2)  # evaluation batches them too


@pytest.mark.slow
def test_copy_vocabulary_training_learns_to_copy(tiny_run):
    """Fit on answers most of whose tokens lie outside a 16-token draft vocabulary: with
    --copy-context the head learns to draft the ones its context holds; without it those tokens
    are never scored, so never drafted, and acceptance stays far lower."""
    model, root = tiny_run
    samples = load_cache(root / "act")[:8]
    batch = collate(samples)
    draft_ids = torch.arange(4, 20)
    acc = {}
    for copy in (False, True):
        torch.manual_seed(0)
        head = MTPHead(Target(model), HeadConfig(draft_vocab_size=16), draft_ids).float()
        obj = MTPObjective(head, TrainConfig(max_draft_tokens=3, bf16=False, copy_context=copy))
        opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
        for _ in range(60):
            loss, n = obj.loss(head, batch)
            opt.zero_grad()
            (loss / n).backward()
            opt.step()
        acc[copy] = obj.acceptance(samples, 8)["pos1"]
    answers = [x for s in samples for x in s.ids[s.prompt_len + 1:].tolist()]
    assert sum(x not in range(4, 20) for x in answers) > 0.5 * len(answers)  # most of the answer must be copied
    assert acc[False] < 0.25 and acc[True] > acc[False] + 0.1  # measured 0.17 vs 0.33


def test_rounds_are_rooted_where_decoding_would_root_them():
    """A round rooted at row t accepts accepted[t] drafts plus the target's own token, and the
    next round is rooted right after them; rows it skips never root one."""
    acc = [2, 9, 9, 0, 1, 9, 3, 0, 0]
    assert round_roots(acc, [True] * 9, 0) == [0, 3, 4, 6]  # then row 10 is past the end
    assert round_roots(acc, [True] * 5 + [False] * 4, 0) == [0, 3, 4]  # row 6 is not valid
    assert round_roots(acc, [True] * 9, 9) == []
    assert round_roots([0] * 5, [True] * 5, 0) == [0, 1, 2, 3, 4]  # nothing accepted: one token per forward


def test_round_weight_adds_weight_only_where_rounds_start(tiny_run):
    """--round-weight w: the loss grows by w times the round-start rows' own loss, and no more
    (every row's loss is >= 0, and the walk roots at most one round per emitted token)."""
    model, root = tiny_run
    samples = load_cache(root / "act")[:4]
    batch = collate(samples)
    head = MTPHead(Target(model), HeadConfig()).float()
    plain, n = MTPObjective(head, TrainConfig(max_draft_tokens=3, bf16=False)).loss(head, batch)
    heavy, m = MTPObjective(head, TrainConfig(max_draft_tokens=3, bf16=False, round_weight=1.0)).loss(head, batch)
    assert n == m and plain < heavy < 2 * plain
    with pytest.raises(mtpspec.InputError, match="round_weight"):
        TrainConfig(round_weight=-1.0)


@pytest.mark.slow
def test_head_overfits_one_batch_to_high_acceptance(tiny_run):
    model, root = tiny_run
    samples = load_cache(root / "act")[:4]
    cfg = TrainConfig(max_draft_tokens=4, bf16=False)
    head = MTPHead(Target(model), HeadConfig()).float()
    obj = MTPObjective(head, cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    batch = collate(samples)
    before = obj.acceptance(samples, 4)
    assert before["accept"] < 1.5 and before["accept_rounds"] < 1.5
    for _ in range(200):
        loss, n = obj.loss(head, batch)
        (loss / n).backward()
        opt.step()
        opt.zero_grad()
    after = obj.acceptance(samples, 4)
    assert after["accept"] > 4.0 and after["accept_rounds"] > 4.0
    # and decoding with it really accepts that much, output still exact
    seq = samples[0].ids
    prompt = seq[None, : samples[0].prompt_len]
    head.eval()
    out = mtpspec.generate(model, head, prompt, max_new_tokens=30, num_draft_tokens=4, eos_token_id=[])
    plain = mtpspec.generate(model, None, prompt, max_new_tokens=30, num_draft_tokens=0, eos_token_id=[])
    assert torch.equal(out.sequences, plain.sequences)
    assert out.stats.mean_accepted > 3.0


def test_resume_after_interruption_matches_an_uninterrupted_run(tiny_run, tmp_path):
    model, root = tiny_run
    cfg = TrainConfig(epochs=2, **{**FAST, "save_every": 1})
    full = tmp_path / "full"
    train(Target(model), root / "act", full, cfg, progress=False)
    cut = tmp_path / "cut"
    r = train(Target(model), root / "act", cut, cfg, max_steps=3, progress=False)  # "killed" after step 3
    assert r["step"] == 3 and not (cut / "head").exists()
    train(Target(model), root / "act", cut, cfg, resume=True, progress=False)
    a, b = _metrics(full), _metrics(cut)
    assert [m["step"] for m in b] == [m["step"] for m in a]  # no lost or repeated step
    assert [m["loss"] for m in b] == pytest.approx([m["loss"] for m in a], rel=1e-5)
    sa = MTPHead.from_pretrained(full / "head", model).state_dict()
    sb = MTPHead.from_pretrained(cut / "head", model).state_dict()
    assert all(torch.allclose(sa[k], sb[k], atol=1e-6) for k in sa)


def test_resume_with_other_settings_is_refused(tiny_run, tmp_path):
    model, root = tiny_run
    train(Target(model), root / "act", tmp_path, TrainConfig(epochs=1, **{**FAST, "save_every": 1}), max_steps=1,
          progress=False)
    with pytest.raises(InputError, match="other training settings"):
        train(Target(model), root / "act", tmp_path, TrainConfig(epochs=1, **{**FAST, "lr": 1e-2}), resume=True,
              progress=False)
    with pytest.raises(InputError, match="does not exist"):
        train(Target(model), root / "act", tmp_path / "new", TrainConfig(epochs=1, **FAST), resume=True,
              progress=False)
    # smaller parts of the same batches (after running out of memory) are the same settings
    r = train(Target(model), root / "act", tmp_path, TrainConfig(epochs=1, **{**FAST, "save_every": 1,
              "micro_batch_tokens": 64}), max_steps=2, resume=True, progress=False)
    assert r["step"] == 2


def _free_port() -> int:
    """A port nobody listens on now: a fixed one can still be in TIME_WAIT from an earlier run."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ddp_processes_follow_one_process(tiny_run, tmp_path):
    model, root = tiny_run
    worker = Path(__file__).parent / "ddp_worker.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, str(worker), str(root / "act"), str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                          str(worker), str(root / "act"), str(tmp_path / "two")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[:2000] + "\n...\n" + two.stderr[-2000:]  # a rank's own error comes first
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert len(a) == len(b) > 3
    assert [m["loss"] for m in b] == pytest.approx([m["loss"] for m in a], rel=1e-3)


def test_draft_vocabulary_maps_back_to_target_ids(tiny_run, tmp_path):
    model, root = tiny_run
    train(Target(model), root / "act", tmp_path, TrainConfig(epochs=1, **FAST), HeadConfig(draft_vocab_size=32),
          progress=False)
    head = MTPHead.from_pretrained(tmp_path / "head", model)
    assert head.config.trained_draft_tokens == FAST["max_draft_tokens"]  # trained for 3, and records it
    freq = token_frequencies(load_cache(root / "act"), 97)
    ids = head.draft_ids.tolist()
    assert len(ids) == 32 and ids == sorted(ids)
    # the draft vocabulary is the most frequent response tokens
    assert min(freq[ids]) >= max(freq[[i for i in range(97) if i not in ids]])
    obj = MTPObjective(head, TrainConfig(**FAST))
    assert torch.equal(obj.vocab_map[head.draft_ids], torch.arange(32))
    assert int((obj.vocab_map >= 0).sum()) == 32
    prompt = load_cache(root / "act")[0].ids[None, :6]
    d = head.propose(DraftInput(prompt, Target(model).forward(prompt[:, :-1], c := Target(model).new_cache()).hidden[:, -1], c),
                     4, SamplingConfig(), None)
    assert set(d.tokens.tolist()) <= set(ids)


def test_activation_cache_resumes_and_checks_settings(tiny_run, tmp_path):
    model, root = tiny_run
    act = tmp_path / "act"
    build_cache(Target(model), root / "data", act, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    m = json.loads((act / "activations.json").read_text())
    m["num_shards"] = 1  # as if killed after the first shard
    (act / "activations.json").write_text(json.dumps(m))
    (act / "act_00001.safetensors").unlink()
    with pytest.raises(DataError, match="incomplete"):
        load_cache(act)
    build_cache(Target(model), root / "data", act, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    a, b = load_cache(act), load_cache(root / "act")
    assert len(a) == len(b) and all(torch.equal(x.top_ids, y.top_ids) for x, y in zip(a, b))
    # a complete cache of the same data is left as it is (the target does not run again)
    stamps = {p.name: p.stat().st_mtime_ns for p in act.glob("act_*.safetensors")}
    build_cache(Target(model), root / "data", act, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in act.glob("act_*.safetensors")} == stamps
    with pytest.raises(DataError, match="other settings"):
        build_cache(Target(model), root / "data", act, (-1,), -1, teacher_topk=4, per_shard=10, progress=False)



def test_activation_cache_from_a_bf16_target(tiny_run, tmp_path):
    """The cache pass runs in bf16 (`--cache-dtype bf16`, the default): its K/V are views of the
    target's cache in the cache's own dtype and must still be written."""
    import copy

    model, root = tiny_run
    target = Target(copy.deepcopy(model).to(torch.bfloat16))
    build_cache(target, root / "data", tmp_path / "act", (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    s = load_cache(tmp_path / "act")[0]
    assert s.keys.dtype == torch.bfloat16 and s.keys.shape[1] == s.ids.shape[0]


def test_activation_cache_extends_when_the_data_grows(tiny_run, tmp_path):
    import shutil

    from mtpspec.training.shards import read_manifest, save_manifest, shard_path, write_shard

    model, root = tiny_run
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    act = tmp_path / "act"
    build_cache(Target(model), data, act, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    first = (act / "act_00000.safetensors").stat().st_mtime_ns
    before = len(load_cache(act))
    # `mtpspec data` adds a shard: the full activation shards stay, the rest is computed
    m = read_manifest(data)
    new = [(list(range(4, 40)), 5), (list(range(40, 90)), 7)]
    write_shard(shard_path(data, m["num_shards"]), new)
    m.update(num_shards=m["num_shards"] + 1, num_samples=m["num_samples"] + 2)
    save_manifest(data, m)
    build_cache(Target(model), data, act, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    grown = load_cache(act)
    assert len(grown) == before + 2 and (act / "act_00000.safetensors").stat().st_mtime_ns == first
    assert grown[len(grown) - 1].ids.tolist() == list(range(40, 90)) and grown[len(grown) - 1].prompt_len == 7
    fresh = tmp_path / "fresh"
    build_cache(Target(model), data, fresh, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    assert all(torch.equal(x.top_ids, y.top_ids) and torch.equal(x.hidden, y.hidden) for x, y in zip(grown, load_cache(fresh)))


def test_the_first_shards_of_a_grown_set_train_on_its_cache(tiny_run, tmp_path):
    """`DIR:N` names a set's first N shards: a cache of the whole, grown set serves them without
    running the target, and holds the very samples (so the same train/held-out split) that a
    cache of those N shards alone would."""
    import shutil

    from mtpspec.training.shards import DataRef, load_samples, read_manifest, save_manifest, shard_path, write_shard
    from mtpspec.training.train import split

    model, root = tiny_run
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    m = read_manifest(data)
    write_shard(shard_path(data, 1), [(list(range(4, 40)), 5), (list(range(40, 90)), 7)])
    save_manifest(data, {**m, "num_shards": 2, "num_samples": m["num_samples"] + 2})
    whole, first = tmp_path / "whole", tmp_path / "first"
    build_cache(Target(model), data, whole, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in whole.glob("act_*")}
    build_cache(Target(model), DataRef.parse(f"{data}:1"), whole, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in whole.glob("act_*")} == stamps  # nothing recomputed
    n = len(load_samples(data, shards=1))
    assert n == m["num_samples"] == len(load_cache(whole)) - 2
    build_cache(Target(model), DataRef(data, 1), first, (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    view, alone = load_cache(whole, limit=n), load_cache(first)
    assert len(view) == len(alone) == n  # the view cuts the cache's last shard (10 + 10 + 6 samples) at 24
    assert all(torch.equal(x.ids, y.ids) and torch.equal(x.hidden, y.hidden) for x, y in zip(view, alone))
    cfg = TrainConfig(holdout=0.25, **FAST)
    assert [s.ids.tolist() for s in split(view, cfg)[1]] == [s.ids.tolist() for s in split(alone, cfg)[1]]
    with pytest.raises(DataError, match="holds 24 samples' activations, not the 25"):
        load_cache(first, limit=25)


def test_a_data_reference_names_a_directory_or_its_first_shards(tmp_path):
    from mtpspec.training.shards import DataRef

    assert DataRef.parse("sets/a:3") == DataRef(Path("sets/a"), 3)
    assert DataRef.parse("sets/a") == DataRef(Path("sets/a")) and str(DataRef.parse("sets/a:3")) == "sets/a:3"
    odd = tmp_path / "b:2"  # a directory whose own name ends in :digits is taken whole
    odd.mkdir()
    assert DataRef.parse(str(odd)) == DataRef(odd)
    assert DataRef.parse("c:x") == DataRef(Path("c:x"))


def test_a_slice_of_a_set_is_its_shards_a_to_b_and_caches_apart(tiny_run, tmp_path):
    """`DIR:A-B` names shards A to B - 1: their samples in order, `DIR:B` minus `DIR:A`; a cache
    of a slice records where it starts, so a cache of the set's first shards is not taken for it;
    a slice that is empty or past the set is refused with the set's size."""
    import shutil

    from mtpspec.training.shards import DataRef, load_samples, read_manifest, save_manifest, shard_path, write_shard

    model, root = tiny_run
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    m = read_manifest(data)
    write_shard(shard_path(data, 1), [(list(range(4, 40)), 5), (list(range(40, 90)), 7)])
    write_shard(shard_path(data, 2), [(list(range(5, 30)), 3)])
    save_manifest(data, {**m, "num_shards": 3, "num_samples": m["num_samples"] + 3})
    ref = DataRef.parse(f"{data}:1-3")
    assert ref == DataRef(data, 3, 1) and str(ref) == f"{data}:1-3"
    def as_lists(ss):
        return [(i.tolist(), pl) for i, pl in ss]

    assert as_lists(ref.samples()) == as_lists(load_samples(data))[len(load_samples(data, 1)):]
    assert as_lists(DataRef.parse(f"{data}:0-2").samples()) == as_lists(load_samples(data, 2))
    build_cache(Target(model), f"{data}:1", tmp_path / "act", (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    with pytest.raises(DataError, match="other settings"):
        build_cache(Target(model), ref, tmp_path / "act", (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    build_cache(Target(model), ref, tmp_path / "slice", (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    assert [s.ids.tolist() for s in load_cache(tmp_path / "slice")] == [i for i, _ in as_lists(ref.samples())]
    with pytest.raises(DataError, match="A must be below B"):
        DataRef.parse(f"{data}:2-2")
    with pytest.raises(DataError, match="has 3 shards.*takes B from 1 to 3, not 5"):
        DataRef.parse(f"{data}:1-5").samples()


def test_training_computes_on_the_cpu_even_where_cuda_is_available(monkeypatch):
    """By default the trainer computes on the CPU, so its autocast and its process group must be
    the CPU's on a machine with CUDA too (a CUDA autocast leaves CPU ops in fp32; NCCL refuses
    CPU tensors); a GPU is only used when asked for (`--device`), and then its ranks talk over NCCL."""
    import torch.distributed as dist

    from mtpspec import models
    from mtpspec.training.devices import autocast, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device() == torch.device("cpu")
    assert autocast(resolve_device(), True).device == "cpu"
    assert models.auto_autocast() == (models.auto_dtype() == torch.bfloat16)
    backends = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: backends.append(backend))
    monkeypatch.setattr(train_mod.atexit, "register", lambda fn: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert train_mod.init_distributed() == (1, 2)
    assert backends == ["gloo"]
    train_mod.init_distributed(torch.device("cuda", 0))  # a GPU asked for (`--device cuda`): NCCL
    assert backends == ["gloo", "nccl"]


def test_a_run_scores_its_held_out_samples_once_at_its_last_step(tiny_run, tmp_path, monkeypatch):
    """The result's `final` is the last step's held-out evaluation, not a second pass over the
    held-out samples (online, every pass runs the target over all of them again)."""
    from mtpspec.training.train import split

    model, root = tiny_run
    cfg = TrainConfig(epochs=1, **FAST)  # eval_every past the run: the last step is the one evaluation
    calls = []
    real = MTPObjective.acceptance
    monkeypatch.setattr(MTPObjective, "acceptance", lambda self, *a: calls.append(1) or real(self, *a))
    r = train(Target(model), root / "act", tmp_path / "a", cfg, HeadConfig(draft_vocab_size=40), progress=False)
    assert len(calls) == 1, calls
    saved = MTPHead.from_pretrained(tmp_path / "a" / "head", model).float()
    held = split(load_cache(root / "act"), cfg)[1]
    assert r["final"] == pytest.approx(real(MTPObjective(saved, cfg), held, cfg.batch_size))
    last = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["accept_rounds"] == r["final"]["accept_rounds"]


def test_continuing_a_saved_head_starts_from_its_weights_and_vocabulary(tiny_run, tmp_path):
    from mtpspec.training.train import split

    model, root = tiny_run
    cfg = TrainConfig(epochs=1, **FAST)
    held = split(load_cache(root / "act"), cfg)[1]
    # trained long enough that its held-out acceptance is not a fresh head's
    train(Target(model), root / "act", tmp_path / "a", TrainConfig(epochs=3, **FAST), HeadConfig(draft_vocab_size=40),
          progress=False)
    saved = MTPHead.from_pretrained(tmp_path / "a" / "head", model).float()
    # zero steps of a continued run evaluate the saved head itself, not a fresh one
    r = train(Target(model), root / "act", tmp_path / "b", cfg, init_head=tmp_path / "a" / "head", max_steps=0, progress=False)
    fresh = train(Target(model), root / "act", tmp_path / "c", cfg, HeadConfig(draft_vocab_size=40), max_steps=0, progress=False)
    assert r["final"] == pytest.approx(MTPObjective(saved, cfg).acceptance(held, cfg.batch_size))
    assert r["final"] != fresh["final"]
    # one more epoch on top changes the weights and keeps the draft vocabulary
    train(Target(model), root / "act", tmp_path / "e", cfg, init_head=tmp_path / "a" / "head", progress=False)
    cont = MTPHead.from_pretrained(tmp_path / "e" / "head", model)
    assert torch.equal(cont.draft_ids, saved.draft_ids)
    assert not torch.equal(cont.fc.weight.float(), saved.fc.weight)
    with pytest.raises(InputError, match="at most 3"):  # the head was trained for FAST's 3
        train(Target(model), root / "act", tmp_path / "f", TrainConfig(epochs=1, **{**FAST, "max_draft_tokens": 7}),
              init_head=tmp_path / "a" / "head", progress=False)


def test_several_data_sets_are_split_one_by_one(tiny_run, tmp_path, monkeypatch):
    """Adding a data set never moves a sample of the first one across the train/held-out split."""
    import mtpspec.training.train as tr

    model, root = tiny_run
    cfg = TrainConfig(epochs=1, holdout=0.3, **FAST)
    held_alone = tr.split(load_cache(root / "act"), cfg)[1]
    calls: list = []
    real = tr.split
    monkeypatch.setattr(tr, "split", lambda s, c: calls.append(real(s, c)) or calls[-1])
    train(Target(model), [root / "act", root / "act"], tmp_path, cfg, max_steps=1, progress=False)
    assert len(calls) == 2
    assert [s.ids.tolist() for s in calls[0][1]] == [s.ids.tolist() for s in held_alone]


def test_step_decay_weights_later_draft_steps_down(tiny_run):
    model, root = tiny_run
    batch = collate(load_cache(root / "act")[:4])
    torch.manual_seed(0)
    head = MTPHead.for_target(model, HeadConfig()).float()
    with torch.no_grad():
        losses = {d: float(MTPObjective(head, TrainConfig(step_decay=d, **FAST)).loss(head, batch)[0]) for d in (1.0, 0.5, 0.01)}
    assert losses[1.0] > losses[0.5] > losses[0.01] > 0
    with pytest.raises(InputError, match="step_decay"):
        TrainConfig(step_decay=0.0)


def test_total_variation_term_is_the_acceptance_gap():
    """The TV term is 0 when the head puts exactly the teacher's probabilities on its top-k,
    and equals 1 - P(a sampled draft passes) = TV(p, q) otherwise."""
    from mtpspec.training.train import distill_loss

    V = 6
    teacher = torch.tensor([0.5, 0.3, 0.2])  # on ids 4, 1, 2
    top_ids = torch.tensor([[[4, 1, 2]]])
    top_logp = teacher.log()[None, None]
    valid = torch.ones(1, 1, dtype=torch.bool)
    labels = torch.tensor([[4]])
    exact = torch.full((1, 1, V), -1e9)
    exact[0, 0, [4, 1, 2]] = teacher.log()
    base, _ = distill_loss(exact, top_logp, top_ids, labels, valid, None, 0.0)
    with_tv, _ = distill_loss(exact, top_logp, top_ids, labels, valid, None, 0.0, tv_weight=1.0)
    assert torch.allclose(with_tv, base, atol=1e-6)
    uniform = torch.zeros(1, 1, V)
    q = torch.full((V,), 1 / V)
    p = torch.zeros(V)
    p[[4, 1, 2]] = teacher
    base, _ = distill_loss(uniform, top_logp, top_ids, labels, valid, None, 0.0)
    with_tv, _ = distill_loss(uniform, top_logp, top_ids, labels, valid, None, 0.0, tv_weight=1.0)
    tv = 0.5 * (p - q).abs().sum()
    assert torch.allclose(with_tv - base, tv, atol=1e-6)
    assert abs(float(1 - torch.minimum(p, q).sum()) - float(tv)) < 1e-6  # TV = 1 - acceptance probability


def test_micro_batches_take_the_same_step_as_whole_batches(tiny_run, tmp_path):
    """Cutting each batch into token-bounded parts (gradient accumulation) changes memory, not
    the optimisation: same losses and same weights as whole batches, up to float rounding."""
    from mtpspec.training.train import token_chunks

    model, root = tiny_run
    samples = load_cache(root / "act")
    parts = token_chunks(samples[:8], 100)
    assert sum(len(p) for p in parts) == 8 and len(parts) > 1
    assert all(len(p) * max(s.ids.shape[0] for s in p) <= 100 or len(p) == 1 for p in parts)
    runs = {}
    for tokens in (0, 100):
        cfg = TrainConfig(epochs=1, micro_batch_tokens=tokens, **FAST)
        train(Target(model), root / "act", tmp_path / f"m{tokens}", cfg, HeadConfig(), max_steps=3, progress=False)
        lines = (tmp_path / f"m{tokens}" / "metrics.jsonl").read_text().splitlines()
        runs[tokens] = [(json.loads(line)["loss"], json.loads(line)["grad_norm"]) for line in lines]
    # the gradient's scale too (Adam would hide a wrong one in the weights)
    assert [x for pair in runs[0] for x in pair] == pytest.approx([x for pair in runs[100] for x in pair], rel=1e-4)
    a = torch.load(tmp_path / "m0" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "m100" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def predictable_model():
    """A tiny model whose greedy text a head can learn, as a small trained model's can: its LM
    head maps token x to a fixed permutation pi(x) (untied, rows of the embedding), and damped
    attention / MLP outputs leave the context only a small say (~96% of its greedy tokens follow
    pi). The usual tiny random model's text depends on the context chaotically: no head learns
    it from a few hundred samples."""
    model = tiny_model("llama", initializer_range=0.1, tie_word_embeddings=False)
    pi = torch.randperm(model.config.vocab_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.lm_head.weight[pi] = model.get_input_embeddings().weight
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(0.3)
    return model


def test_the_plan_gives_a_small_set_enough_steps_and_a_short_warm_up():
    """A 400-sample set is ~24 batches an epoch: the default plan passes over it until the run
    takes min_steps, and warms up over warmup_fraction of them (once 2 epochs were 48 steps,
    all inside a 50-step warm-up). A large set keeps `epochs` and the full warm-up."""
    cfg = TrainConfig()
    for per_epoch in (1, 3, 24, 199, 200, 201):
        epochs, warmup = cfg.plan(per_epoch)
        total = epochs * per_epoch
        assert total >= cfg.min_steps and (epochs == cfg.epochs or (epochs - 1) * per_epoch < cfg.min_steps)
        assert 1 <= warmup <= min(cfg.warmup_steps, math.ceil(cfg.warmup_fraction * total)) < total
    assert cfg.plan(10_000) == (cfg.epochs, cfg.warmup_steps)
    assert TrainConfig(min_steps=0, epochs=3, warmup_fraction=1.0).plan(24) == (3, 50)  # the old rule
    assert TrainConfig(warmup_steps=0).plan(24)[1] == 0


@pytest.mark.slow
def test_default_training_on_a_400_sample_set_accepts_at_least_1_5(tmp_path):
    """`mtpspec train`'s defaults on a 400-sample self-written set give a head that accepts at
    least 1.5 tokens per forward on the set's held-out part, and no advice. (Two epochs with a
    50-step warm-up, the old defaults, gave 1.03 here; 460 steps 2.9.)"""
    model = predictable_model()
    write_tiny_data(model, tmp_path / "data", n=400, batch=100)
    build_cache(Target(model), tmp_path / "data", tmp_path / "act", (-1,), -1, progress=False)
    r = train(Target(model), tmp_path / "act", tmp_path / "run", TrainConfig(), progress=False)
    assert r["step"] == r["total_steps"] >= TrainConfig().min_steps
    assert r["final"]["accept_rounds"] >= 1.5, r  # measured 2.90
    assert "advice" not in r


def test_a_run_whose_acceptance_stays_near_1_says_what_to_change(tiny_run, tmp_path, caplog):
    """The chaotic tiny model's text is not learnable from 24 samples: the run ends with a
    warning, also in its result, naming what to change."""
    model, root = tiny_run
    with caplog.at_level("WARNING", logger="mtpspec.train"):
        r = train(Target(model), root / "act", tmp_path, TrainConfig(epochs=1, **{**FAST, "holdout": 0.25}),
                  progress=False)
    assert r["final"]["accept_rounds"] < train_mod.LOW_ACCEPTANCE
    advice = r["advice"]
    assert [rec.getMessage() for rec in caplog.records if rec.name == "mtpspec.train"] == [advice]
    assert f"{r['final']['accept_rounds']:.2f} tokens per target forward" in advice
    for hint in ("more data", "--epochs", "--lr", "--warmup-steps", f"ran {r['step']} of {r['total_steps']} steps"):
        assert hint in advice, hint
    # a good run, or one with nothing held out, gets none
    assert train_mod.low_acceptance_advice({"accept_rounds": 1.5}, TrainConfig(), 400, 400, 400, 17, 20) is None
    assert train_mod.low_acceptance_advice({}, TrainConfig(), 400, 400, 400, 17, 20) is None


def test_online_activations_equal_the_cache_and_train_the_same_head(tiny_run, tmp_path):
    """`--online`: each sample's activations computed when read equal the cached ones bit for bit,
    so a run trains the same head as a run on the cache, with nothing written but the run."""
    from mtpspec.training.activations import online_samples

    model, root = tiny_run
    cached = load_cache(root / "act")
    online = online_samples(Target(model), root / "data", (-1,), -1, teacher_topk=8)
    assert len(online) == len(cached)
    for i in (0, 7, len(cached) - 1):
        a, b = cached[i], online[i]
        for name in ("ids", "hidden", "keys", "values", "top_logp", "top_ids"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (i, name)
        assert a.prompt_len == b.prompt_len
    assert [t.tolist() for t, _ in online.tokens()] == [t.tolist() for t, _ in cached.tokens()]
    cfg = TrainConfig(epochs=1, **FAST)
    train(Target(model), root / "act", tmp_path / "cached", cfg, progress=False, max_steps=3)
    train(Target(model), online, tmp_path / "online", cfg, progress=False, max_steps=3)
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=False)["model"] for d in ("cached", "online"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((tmp_path / "online").glob("act*"))


def _interrupted_cache(model, root, d, shards: int):
    """A cache of the tiny set left as a build stopped after `shards` shards of 7 samples leaves it
    (its later shard files gone, so reading one would fail)."""
    m = build_cache(Target(model), root / "data", d, (-1,), -1, teacher_topk=8, per_shard=7, progress=False)
    for s in range(shards, m["total_shards"]):
        (d / f"act_{s:05d}.safetensors").unlink()
    (d / "activations.json").write_text(json.dumps({**m, "num_shards": shards}))
    return d


def test_one_progress_bar_counts_every_sets_shards_and_rates_only_those_computed(tiny_run, tmp_path):
    """`train_on_data` caches its sets under one bar: each set adds its shards, those found cached
    as the bar's starting count (tqdm's `initial`, which its rate and remaining time leave out)."""
    import io

    from tqdm import tqdm

    model, root = tiny_run
    part = _interrupted_cache(model, root, tmp_path / "part", shards=2)  # 2 of the set's 4 shards of 7
    bar = tqdm(total=12, file=io.StringIO())
    build_cache(Target(model), root / "data", part, (-1,), -1, teacher_topk=8, per_shard=7, bar=bar)  # resumed
    assert (bar.n, bar.initial) == (4, 2)
    build_cache(Target(model), root / "data", part, (-1,), -1, teacher_topk=8, per_shard=7, bar=bar)  # whole already
    assert (bar.n, bar.initial) == (8, 6)
    build_cache(Target(model), root / "data", tmp_path / "new", (-1,), -1, teacher_topk=8, per_shard=7, bar=bar)
    assert (bar.n, bar.initial) == (12, 6) and "12/12" in bar.__str__() and not bar.disable
    assert load_cache(part).refs and len(load_cache(tmp_path / "new")) == len(load_cache(part))


def test_online_reads_the_samples_a_cache_holds_and_computes_only_the_rest(tiny_run, tmp_path):
    """`--online` over a set that a smaller run cached in part (another shard size, interrupted):
    the first samples come from that cache's shards, the rest from the target, and every sample
    and the trained head equal a run on the whole cache. A cache made for other settings is not read."""
    from mtpspec.training.activations import OnlineSource, Shard, online_samples

    model, root = tiny_run
    part = _interrupted_cache(model, root, tmp_path / "part", shards=2)
    other = build_cache(Target(model), root / "data", tmp_path / "other", (-1,), -1, teacher_topk=4, progress=False)
    assert other["num_shards"] == other["total_shards"]  # whole, but its teacher keeps 4 log-probs, not 8
    cached = load_cache(root / "act")
    mixed = online_samples(Target(model), root / "data", (-1,), -1, teacher_topk=8, caches=[tmp_path / "other", part])
    assert [type(src) for src, _ in mixed.refs] == [Shard] * 14 + [OnlineSource] * (len(cached) - 14)
    for i in (0, 13, 14, len(cached) - 1):
        a, b = cached[i], mixed[i]
        assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("ids", "hidden", "keys", "values", "top_logp",
                                                                       "top_ids")), i
    alone = online_samples(Target(model), root / "data", (-1,), -1, teacher_topk=8, caches=[tmp_path / "other"])
    assert {type(src) for src, _ in alone.refs} == {OnlineSource}
    cfg = TrainConfig(epochs=1, **FAST)
    train(Target(model), root / "act", tmp_path / "cached", cfg, progress=False, max_steps=3)
    train(Target(model), mixed, tmp_path / "mixed", cfg, progress=False, max_steps=3)
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=False)["model"] for d in ("cached", "mixed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cache_keeps_the_teacher_only_where_a_loss_reads_it(tiny_run, dtype):
    """The teacher's log-probs are stored from row prompt_len - 1 on (the law of the first answer
    token), bit for bit what the LM head over every row gives there; the prompt's rows hold
    NO_TEACHER; and the head's loss is the same as with the teacher on every row."""
    from mtpspec.training.activations import NO_TEACHER, activations
    from mtpspec.training.shards import load_samples

    model, root = tiny_run
    target = Target(deepcopy(model).to(dtype))
    head = MTPHead.for_target(model)  # fp32, as training runs it, whatever the data's dtype
    obj = MTPObjective(head, TrainConfig(epochs=1, **{**FAST, "max_draft_tokens": 3}))
    stored, full = [], []
    for ids, pl in load_samples(root / "data")[:5]:
        a = activations(target, ids, pl, (-1,), target.layer_index(-1), 8)
        logits = target.forward(ids[None], target.new_cache()).logits[0]  # (T, V): every row
        top = logits.log_softmax(-1).topk(8, dim=-1)
        assert torch.equal(a["top_logp"][pl - 1:], top.values[pl - 1:].to(torch.float16))
        assert torch.equal(a["top_ids"][pl - 1:], top.indices[pl - 1:].int())
        assert bool((a["top_logp"][:pl - 1] == NO_TEACHER).all()) and not a["top_ids"][:pl - 1].any()
        every = {**a, "top_logp": top.values.to(torch.float16), "top_ids": top.indices.int()}
        stored.append(_sample(a))
        full.append(_sample(every))
    with torch.no_grad():
        (x, n), (y, m) = obj.loss(head, collate(stored)), obj.loss(head, collate(full))
    assert n == m > 0 and torch.equal(x, y)


def _sample(t: dict) -> Sample:
    return Sample(ids=t["ids"].long(), prompt_len=int(t["prompt_len"][0]), hidden=t["hidden"], keys=t["keys"],
                  values=t["values"], top_logp=t["top_logp"], top_ids=t["top_ids"].long())


def test_mtpspec_train_online_writes_no_activation_cache(tmp_path):
    from conftest import save_tiny_model_dir
    from typer.testing import CliRunner

    from mtpspec.cli import app

    model, _ = save_tiny_model_dir(tmp_path / "model")
    write_tiny_data(model, tmp_path / "data", n=8, new=20)
    r = CliRunner().invoke(app, ["train", "--target", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--out",
                                 str(tmp_path / "run"), "--online", "--min-steps", "2", "--batch-size", "4",
                                 "--no-bf16", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "head" / "mtp_head.safetensors").is_file()
    assert not list((tmp_path / "run").glob("activations*"))


def test_mtpspec_train_online_continues_from_another_runs_cache(tmp_path):
    """`mtpspec train --online --cache-from RUN`: the samples RUN's cache holds are read from it
    (the run says how many) and nothing is cached in --out; a wrong --cache-from is refused
    before any model loads."""
    from conftest import save_tiny_model_dir
    from typer.testing import CliRunner

    from mtpspec.cli import app

    model, _ = save_tiny_model_dir(tmp_path / "model")
    write_tiny_data(model, tmp_path / "data", n=12, new=20)
    _interrupted_cache(model, tmp_path, tmp_path / "small" / "activations", shards=1)
    base = ["train", "--target", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--min-steps", "2",
            "--batch-size", "4", "--no-bf16", "--threads", "1", "--cache-dtype", "fp32", "--hidden-layers", "-1",
            "--kv-layer", "-1", "--teacher-topk", "8"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "run"), "--online", "--cache-from", str(tmp_path / "small")])
    assert r.exit_code == 0, r.output
    assert "7 of 12 samples' activations read from its cache" in r.output
    assert (tmp_path / "run" / "head" / "mtp_head.safetensors").is_file()
    assert not list((tmp_path / "run").glob("activations*"))
    for extra, why in ([["--cache-from", str(tmp_path / "small")], "add --online"],
                       [["--online", "--cache-from", str(tmp_path / "nowhere")], "no such folder"],
                       [["--online", "--cache-from", str(tmp_path / "data")], "holds no activation caches"]):
        r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "bad"), *extra])
        assert r.exit_code == 2 and why in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "bad").exists()


# -- the draft-model baseline (issue 47) ----------------------------------------------------------
def _draft_cfg(**kw):
    return TrainConfig(**{**dict(kind="draft-model", bf16=False), **kw})


def test_a_draft_models_loss_scores_only_answer_rows_and_equals_scoring_every_row(tiny_run):
    """The draft model's LM head runs from the batch's first answer row on (most rows are prompt
    rows, and a full-vocabulary row is most of a step): the loss equals the one over every row's
    logits, and the sum of the sequences' losses alone."""
    from mtpspec.training.train import DraftModelObjective, distill_loss, draft_model, target_rows

    model, root = tiny_run
    samples = _uneven(load_cache(root / "act")[:6])
    cfg = _draft_cfg(draft_model_hidden=16)
    dm = draft_model(Target(model), cfg)
    obj = DraftModelObjective(dm, cfg)
    batch = collate(samples)
    with torch.no_grad():
        together, n = obj.loss(dm, batch)
        ids = batch["ids"]
        mask = (torch.arange(ids.shape[1]).unsqueeze(0) < batch["lengths"].unsqueeze(1)).long()
        every = dm(input_ids=ids, attention_mask=mask).logits  # (B, T, V): every row
        labels = torch.nn.functional.pad(ids[:, 1:], (0, 1))
        full, n_full = distill_loss(every, batch["top_logp"], batch["top_ids"], labels, target_rows(batch, 1), None,
                                    cfg.label_weight)
        alone = [obj.loss(dm, collate([s])) for s in samples]
    assert n == n_full == sum(m for _, m in alone) > 0
    assert float(together) == pytest.approx(float(full), rel=1e-5)
    assert float(together) == pytest.approx(sum(float(x) for x, _ in alone), rel=1e-5)


@pytest.mark.parametrize("quantized", [False, True])
def test_a_draft_model_started_from_the_target_is_its_first_layers(quantized):
    """`--draft-model-init target`: with every layer the draft model computes the target's
    logits; with one, it holds the target's embedding, first layer and norm. Its weights are its
    own copy (training it leaves the target as it was), also from a GGUF target's blocks."""
    from test_quant_target import quantized_pair

    from mtpspec.training.train import draft_model

    model = quantized_pair(2, torch.float32)[1] if quantized else tiny_model("llama")
    target = Target(model)
    H, L = model.config.hidden_size, model.config.num_hidden_layers
    whole = draft_model(target, _draft_cfg(draft_model_hidden=H, draft_model_layers=L, draft_model_init="target"))
    ids = torch.tensor([[5, 17, 42, 8, 9, 30, 2]])
    with torch.no_grad():
        assert torch.allclose(whole(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)
    one = draft_model(target, _draft_cfg(draft_model_hidden=H, draft_model_layers=1, draft_model_init="target"))
    assert one.config.num_hidden_layers == 1 and one.config.hidden_size == H
    assert torch.equal(one.model.layers[0].self_attn.q_proj.weight, whole.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(one.model.embed_tokens.weight, whole.model.embed_tokens.weight)
    with torch.no_grad():
        before = model(ids).logits.clone()
        for p in one.parameters():
            p.add_(1.0)
        assert torch.equal(model(ids).logits, before)


def test_a_draft_model_init_that_cannot_copy_the_target_says_why():
    from mtpspec.training.train import draft_model

    llama = Target(tiny_model("llama"))
    with pytest.raises(InputError, match="--draft-model-hidden must be its width, 32"):
        draft_model(llama, _draft_cfg(draft_model_hidden=16, draft_model_init="target"))
    with pytest.raises(InputError, match="more than the target's 2 layers"):
        draft_model(llama, _draft_cfg(draft_model_hidden=32, draft_model_layers=3, draft_model_init="target"))
    with pytest.raises(InputError, match="copies a Llama target's layers; this target is 'qwen2'"):
        draft_model(Target(tiny_model("qwen2")), _draft_cfg(draft_model_hidden=32, draft_model_init="target"))
    with pytest.raises(InputError, match="draft_model_init must be one of random, target"):
        _draft_cfg(draft_model_init="copy")
