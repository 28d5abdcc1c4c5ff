"""Self-distillation data: the target writes prompts and answers; runs resume exactly."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_tiny_model_dir
from safetensors.torch import load_file

from mtpspec.errors import DataError, InputError
from mtpspec.training.data import DataConfig, generate_data, is_degenerate, read_prompts_file
from mtpspec.training.shards import load_samples

CFG = dict(batch_size=4, max_prompt_tokens=8, max_response_tokens=10, require_finished_prompts=False, seed=3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    model, tok = save_tiny_model_dir(d)
    return model, tok


def _shards(d):
    return [load_file(str(p)) for p in sorted(d.glob("shard_*.safetensors"))]


def test_writes_samples_and_manifest(tiny, tmp_path):
    model, tok = tiny
    m = generate_data(model, tok, tmp_path, DataConfig(num_samples=6, **CFG), progress=False)
    samples = load_samples(tmp_path)
    assert m["num_samples"] == len(samples) >= 6 and m["target"]["architecture"] == "llama"
    for ids, pl in samples:
        assert 0 < pl < ids.shape[0]
        # the prompt is the chat template around a user turn: it starts with the template's w4
        assert tok.decode(ids[:pl]).startswith("w4")


@pytest.mark.slow
def test_resume_extends_exactly_like_one_run(tiny, tmp_path):
    model, tok = tiny
    generate_data(model, tok, tmp_path / "one", DataConfig(num_samples=8, **CFG), progress=False)
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=3, **CFG), progress=False)
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=8, **CFG), progress=False)
    a, b = load_samples(tmp_path / "one"), load_samples(tmp_path / "two")
    assert len(a) == len(b) >= 8  # whole batches: a resumed run writes what one run writes
    assert all(torch.equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
    # no prompt appears twice
    prompts = [tuple(s[0][: s[1]].tolist()) for s in b]
    assert len(set(prompts)) == len(prompts)


def test_other_settings_in_same_dir_are_refused(tiny, tmp_path):
    model, tok = tiny
    generate_data(model, tok, tmp_path, DataConfig(num_samples=2, **CFG), progress=False)
    with pytest.raises(DataError, match="other settings") as e:
        generate_data(model, tok, tmp_path, DataConfig(num_samples=4, **{**CFG, "seed": 9}), progress=False)
    assert "config.seed: was 3, now 9" in str(e.value)  # the flag to fix, not the whole settings dump
    assert "max_prompt_tokens" not in str(e.value)


def test_settings_diff_names_each_changed_leaf():
    from mtpspec.training.data import settings_diff

    was = {"config": {"seed": 1, "batch_size": 4}, "dtype": "bfloat16", "corpus": None}
    now = {"config": {"seed": 1, "batch_size": 8}, "dtype": "float32", "passages": {"count": 3}}
    assert settings_diff(was, now) == ("config.batch_size: was 4, now 8; dtype: was 'bfloat16', now 'float32'; "
                                       "passages: was None, now {'count': 3}")
    assert settings_diff(was, was) == ""


def test_prompts_file_sources(tiny, tmp_path):
    model, tok = tiny
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"turns": ["w9 w10 w11"]}) + "\n" + json.dumps({"prompt": "w12 w13"}) + "\n")
    assert read_prompts_file(f) == ["w9 w10 w11", "w12 w13"]
    m = generate_data(model, tok, tmp_path / "out", DataConfig(num_samples=4, **CFG), prompts_file=str(f),
                      progress=False)
    assert m["num_samples"] >= 4
    texts = [tok.decode(ids[:pl]) for ids, pl in load_samples(tmp_path / "out")]
    assert any("w9 w10 w11" in t or "w12 w13" in t for t in texts)


def test_bad_sources_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_prompts_file(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(DataError, match="bad.jsonl:1 is not valid JSON"):
        read_prompts_file(bad)
    with pytest.raises(DataError, match="no mtpspec data|not an mtpspec data"):
        load_samples(tmp_path)
    with pytest.raises(InputError, match="batch_size"):
        DataConfig(batch_size=0)


def test_base_model_gets_continuation_data_and_chat_is_refused_up_front(tiny, tmp_path):
    import copy

    model, tok = tiny
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    with pytest.raises(InputError, match="has no chat template.*--recipe continuation"):
        generate_data(model, plain, tmp_path / "out", DataConfig(num_samples=2, recipe="chat", **CFG), progress=False)
    assert not (tmp_path / "out").exists()
    m = generate_data(model, plain, tmp_path / "out", DataConfig(num_samples=6, **CFG), progress=False)
    assert m["settings"]["recipe"] == "continuation"
    samples = load_samples(tmp_path / "out")
    assert len(samples) >= 6
    from mtpspec.training.data import CONTINUATION_OPENERS

    starts = {tuple(plain(op)["input_ids"]) or (3,) for op in CONTINUATION_OPENERS}  # (3,): EOS, for no BOS
    for ids, pl in samples:  # an opener continued by the target (no chat template), then its continuation
        assert any(tuple(ids[: len(st)].tolist()) == st for st in starts)
        assert 1 <= pl < len(ids)


def test_continuation_of_a_corpus(tiny, tmp_path):
    import copy

    model, tok = tiny
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"w{10 + i % 80}" for i in range(400)))
    generate_data(model, plain, tmp_path / "out", DataConfig(num_samples=4, **CFG), corpus=str(corpus), progress=False)
    prefixes = [tok.decode(ids[1:pl]) for ids, pl in load_samples(tmp_path / "out")]
    assert any(p.startswith("w") and p in corpus.read_text() for p in prefixes)


def test_document_recipe_writes_passages_requests_and_follow_ups(tiny, tmp_path):
    model, tok = tiny
    cfg = DataConfig(num_samples=1, **{**CFG, "batch_size": 6, "max_document_tokens": 24}, document_share=1.0,
                     follow_up_share=1.0)
    generate_data(model, tok, tmp_path, cfg, progress=False)
    prompts = [tok.decode(ids[:pl]).split() for ids, pl in load_samples(tmp_path)]
    # passages (one user turn), requests over them (the passage's words inside the user turn) and
    # follow-ups (two user turns): one batch of seeds gives more samples than seeds
    assert len(prompts) > 6
    assert any(p.count("w4") >= 3 for p in prompts)  # user, assistant, user: each message opens with w4
    assert max(len(p) for p in prompts) > 24


def test_shards_are_compact_and_plain_ones_still_read(tmp_path):
    from mtpspec.training.shards import read_shard, shard_path, write_shard

    samples = [([1, 2, 3, 60000], 2), ([7] * 50, 10)]
    write_shard(tmp_path / "shard_00000.safetensors.xz", samples)
    got = read_shard(shard_path(tmp_path, 0))
    assert [(s.tolist(), p) for s, p in got] == samples
    assert (tmp_path / "shard_00000.safetensors.xz").stat().st_size < 54 * 2 + 200  # uint16, compressed
    write_shard(tmp_path / "shard_00001.safetensors", [([70000, 1], 1)])  # int32 ids past uint16
    assert shard_path(tmp_path, 1).name == "shard_00001.safetensors"
    assert read_shard(shard_path(tmp_path, 1))[0][0].tolist() == [70000, 1]


def test_task_helpers_are_deterministic():
    import random

    from mtpspec.training.tasks import add_typos, code_prefix, is_repetitive, request_over

    text = "Please remember to bring the quarterly report tomorrow morning before the meeting starts."
    a, b = add_typos(text, random.Random(1), rate=0.5), add_typos(text, random.Random(1), rate=0.5)
    assert a == b != text and len(a.split()) == len(text.split())
    code = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(10)) + "\n```"
    cut = code_prefix(code, random.Random(0))
    assert cut.startswith("x0 = 0") and 3 <= cut.count("\n") <= 7
    assert is_repetitive("\n".join(f"{i}. **Dessert**" for i in range(10)))
    assert not is_repetitive("\n".join(f"line about {w}" for w in "abcdefgh"))
    req = request_over("email", text, random.Random(3))
    assert text[:20] in req or "Translate" in req or add_typos(text, random.Random(3))[:5] in req


def test_a_bad_prompts_file_leaves_no_output_directory(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(DataError, match="does not exist"):
        generate_data(model, tok, tmp_path / "out", DataConfig(num_samples=2, **CFG), prompts_file=str(tmp_path / "no.txt"),
                      progress=False)
    assert not (tmp_path / "out").exists()


def test_damaged_data_directories_are_data_errors(tiny, tmp_path):
    model, tok = tiny
    d = tmp_path / "d"
    generate_data(model, tok, d, DataConfig(num_samples=4, **CFG), progress=False)
    manifest = (d / "manifest.json").read_text()
    (d / "manifest.json").write_text(manifest[: len(manifest) // 2])  # cut short, as by a full disk
    with pytest.raises(DataError, match="manifest.json is not valid JSON"):
        load_samples(d)
    with pytest.raises(DataError, match="manifest.json is not valid JSON"):  # resuming reads it too
        generate_data(model, tok, d, DataConfig(num_samples=4, **CFG), progress=False)
    (d / "manifest.json").write_text(json.dumps({"num_shards": 1}))
    with pytest.raises(DataError, match="not an mtpspec data manifest"):
        load_samples(d)
    (d / "manifest.json").write_text(manifest)
    (d / "shard_00000.safetensors.xz").write_bytes(b"not a shard")
    with pytest.raises(DataError, match="shard_00000.safetensors.xz is missing or unreadable"):
        load_samples(d)
    (d / "shard_00000.safetensors.xz").unlink()
    with pytest.raises(DataError, match="shard_00000.safetensors.xz is missing or unreadable"):
        load_samples(d)


def test_degenerate_filter():
    assert is_degenerate([5, 5, 5, 5, 5, 5, 5, 5, 5, 6])
    assert is_degenerate([1, 2])
    assert is_degenerate([1, 2, 3, 4] * 10)
    assert not is_degenerate(list(range(10, 60)))


def test_real_passages_are_cut_at_blank_lines_by_kind(tmp_path):
    from mtpspec.training.data import passage_chunks

    docs = tmp_path / "docs"
    docs.mkdir()
    paras = [" ".join(f"w{10 + (i * 7 + j) % 80}" for j in range(30)) for i in range(12)]  # ~120 chars each
    (docs / "a.rst").write_text("\n\n".join(paras))
    (docs / "b.py").write_text("def f(x):\n    return x\n" * 20)
    (docs / "image.png").write_bytes(b"\x89PNG")  # not text: skipped
    got = passage_chunks(docs, max_chars=400, min_chars=200)
    prose = [t for k, t in got if k == "article"]
    assert {k for k, _ in got} == {"article", "code"}
    assert all(200 <= len(t) <= 400 for t in prose)
    # every paragraph lands whole in exactly one passage, in order
    assert "\n\n".join(prose) == "\n\n".join(paras)
    assert passage_chunks([docs, docs / "a.rst"], max_chars=400, min_chars=200) == got + [("article", t) for t in prose]
    with pytest.raises(DataError, match="Passages path .*missing does not exist"):
        passage_chunks(tmp_path / "missing")
    with pytest.raises(DataError, match="No passages"):
        passage_chunks(docs / "image.png")


def test_requests_over_real_passages_resume_exactly(tiny, tmp_path):
    model, tok = tiny
    passage = " ".join(f"w{10 + i % 80}" for i in range(120))
    (tmp_path / "p.txt").write_text(passage)
    cfg = dict(CFG, document_share=1.0, passage_share=1.0)
    src = [str(tmp_path / "p.txt")]
    m = generate_data(model, tok, tmp_path / "one", DataConfig(num_samples=6, **cfg), progress=False, passages=src)
    assert m["settings"]["passages"]["count"] == 1
    texts = [tok.decode(ids[:pl]) for ids, pl in load_samples(tmp_path / "one")]
    assert texts and any(passage[:60] in t for t in texts)  # the request carries the real passage
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=2, **cfg), progress=False, passages=src)
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=6, **cfg), progress=False, passages=src)
    a, b = load_samples(tmp_path / "one"), load_samples(tmp_path / "two")
    assert len(a) == len(b) and all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    (tmp_path / "p.txt").write_text(passage + " w11")  # other passages: not the same run
    with pytest.raises(DataError, match="other settings"):
        generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=8, **cfg), progress=False, passages=src)


def test_a_set_written_before_the_generation_setting_is_extended_as_written(tiny, tmp_path):
    model, tok = tiny
    d = tmp_path / "old"
    generate_data(model, tok, d, DataConfig(num_samples=3, **CFG), progress=False)
    m = json.loads((d / "manifest.json").read_text())
    assert m["settings"].pop("generation")["attention"] == "mtpspec_grouped_decode"
    (d / "manifest.json").write_text(json.dumps(m))  # as an older mtpspec wrote it
    generate_data(model, tok, d, DataConfig(num_samples=6, **CFG), progress=False)
    assert "generation" not in json.loads((d / "manifest.json").read_text())["settings"]
    assert len(load_samples(d)) >= 6


def test_length_buckets_give_each_row_what_one_call_gives(tiny, monkeypatch):
    """Greedy generation per bucket equals one call over the whole padded batch (fp32), row by row."""
    from mtpspec.training import data, fast_generate

    calls = []

    def cheap_calls(lengths, max_new):  # a call costs nothing: cut wherever padding is saved
        calls.append(b := fast_generate.length_buckets(lengths, max_new, bucket_cost=0))
        return b

    monkeypatch.setattr(data, "length_buckets", cheap_calls)
    model, tok = tiny
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 90, (n,), generator=g).tolist() for n in (3, 40, 4, 5, 38, 3)]
    one = data._Writer(model, tok, DataConfig(), [1], buckets=False).generate(rows, 6, 0.0)
    assert not calls
    many = data._Writer(model, tok, DataConfig(), [1], buckets=True).generate(rows, 6, 0.0)
    assert len(calls[0]) >= 2 and many == one


def test_a_set_written_before_length_buckets_is_extended_in_one_call_per_batch(tiny, tmp_path, monkeypatch):
    from mtpspec.training import data

    model, tok = tiny
    d = tmp_path / "old"
    generate_data(model, tok, d, DataConfig(num_samples=3, **CFG), progress=False)
    m = json.loads((d / "manifest.json").read_text())
    assert m["settings"]["generation"].pop("batching") == "length-buckets"
    (d / "manifest.json").write_text(json.dumps(m))  # as an mtpspec before length buckets wrote it
    monkeypatch.setattr(data, "length_buckets", lambda *a: pytest.fail("an old set must not be bucketed"))
    generate_data(model, tok, d, DataConfig(num_samples=6, **CFG), progress=False)
    assert "batching" not in json.loads((d / "manifest.json").read_text())["settings"]["generation"]
    assert len(load_samples(d)) >= 6


def test_everyday_requests_are_seeded_filled_and_varied():
    import random

    from mtpspec.training.everyday import everyday_request

    a = [everyday_request(random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    reqs = [everyday_request(rng) for rng in [random.Random(0)] for _ in range(2000)]
    assert not any("{" in r or "}" in r for r in reqs)  # every slot filled
    assert len(set(reqs)) > 1800  # slot draws make most requests unique (repeats are dropped when written)
    for marker in ("notifications", "chat", "email", "repl", "```python", "?"):  # each kind shows up
        assert sum(marker in r.lower() for r in reqs) > 50, marker


def test_everyday_requests_share_no_phrase_with_the_built_in_prompts():
    # the built-in set measures transfer to people's requests: the templates must not copy it
    import random
    from importlib.resources import files

    from mtpspec.training.everyday import everyday_request

    def grams(text, n=5):
        w = text.lower().replace("'", " ").split()
        return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}

    builtin = set()
    for line in files("mtpspec.prompts").joinpath("default.jsonl").read_text().splitlines():
        builtin |= grams(json.loads(line)["turns"][0])
    rng = random.Random(1)
    shared = set().union(*(grams(everyday_request(rng)) for _ in range(3000))) & builtin
    assert not shared, sorted(shared)[:5]


@pytest.mark.slow
def test_everyday_share_asks_template_requests_and_leaves_older_sets_resumable(tiny, tmp_path):
    import random

    from mtpspec.training.data import _prompt_stream
    from mtpspec.training.everyday import everyday_request

    model, tok = tiny
    cfg = DataConfig(num_samples=1, **CFG, everyday_share=1.0, follow_up_share=0.0)
    m = generate_data(model, tok, tmp_path / "e", cfg, progress=False)
    assert m["settings"]["config"]["everyday_share"] == 1.0
    # every seed is a template request, answered as it is (no self-written turn)
    stream = _prompt_stream(cfg, "chat", [])
    seeds = [next(stream) for _ in range(cfg.batch_size)]
    assert all(kind == "everyday" for kind, _ in seeds)
    rng = random.Random(cfg.seed)
    assert seeds[0][1] == (rng.random(), everyday_request(rng))[1]  # one draw for the share, then the request
    want = {tuple(tok(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)["input_ids"])
            for _, text in seeds}
    got = {tuple(ids[:pl].tolist()) for ids, pl in load_samples(tmp_path / "e")}
    assert got and got <= want
    # at 0 the setting is not recorded, so sets written before it existed still resume
    m = generate_data(model, tok, tmp_path / "o", DataConfig(num_samples=2, **CFG), progress=False)
    assert "everyday_share" not in m["settings"]["config"]
    with pytest.raises(InputError, match="everyday-share"):
        generate_data(model, tok, tmp_path / "c", DataConfig(num_samples=2, **CFG, recipe="continuation",
                                                             everyday_share=0.5), progress=False)
    assert not (tmp_path / "c").exists()


def test_the_batched_engine_writes_mtpspec_plain_decoding_and_resumes_exactly(tiny, tmp_path):
    """--engine batch: every answer is mtpspec's plain greedy decoding of its prompt (the head's
    drafts change nothing), the set records how it was written, and a resumed run writes what
    one run writes."""
    import mtpspec
    from mtpspec.core import fused
    from mtpspec.training.batch_generate import GENERATION
    from mtpspec.training.data import recorded_engine, stop_token_ids

    model, tok = tiny
    head = mtpspec.MTPHead.for_target(model)
    m = generate_data(model, tok, tmp_path / "one", DataConfig(num_samples=8, **CFG), progress=False, engine="batch",
                      head=head)
    target, stop = mtpspec.Target(model), stop_token_ids(model, tok)
    assert m["settings"]["generation"] == {**GENERATION, "matmuls": fused.matmuls(target)}
    assert recorded_engine(tmp_path / "one") == "batch"
    samples = load_samples(tmp_path / "one")
    assert len(samples) >= 8
    for ids, pl in samples:
        # the answer's own length (a stage's max_new, or where it stopped): plain decoding up to it
        plain = mtpspec.generate(target, None, ids[None, :pl], ids.shape[0] - pl, num_draft_tokens=0, eos_token_id=stop)
        assert plain.sequences[0].tolist() == ids.tolist()
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=3, **CFG), progress=False, engine="batch", head=head)
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=8, **CFG), progress=False, engine="batch")
    b = load_samples(tmp_path / "two")
    assert len(b) == len(samples) and all(torch.equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(samples, b))


def test_batches_in_flight_write_what_one_batch_at_a_time_writes(tiny, tmp_path, monkeypatch):
    """The batched writer keeps several data batches in flight, their rows sharing forwards, their
    sampled user turns drawn from each batch's own seeds: the set is, shard for shard and hash for
    hash, the one written one batch at a time, and a run stopped with batches in flight resumes
    to the same set."""
    from mtpspec.training import data as D

    model, tok = tiny
    cfg = DataConfig(num_samples=24, **CFG)
    calls: list[int] = []
    pool_submit = D.RowPool.submit

    def submit(self, rows, *a, **k):
        calls.append(len(self.pending) + len(self.live))  # rows of other jobs still queued or running
        return pool_submit(self, rows, *a, **k)

    monkeypatch.setattr(D.RowPool, "submit", submit)
    many = generate_data(model, tok, tmp_path / "many", cfg, progress=False, engine="batch")
    assert max(calls) > 0  # jobs of several batches were in the pool at once

    class OneAtATime(D._BatchWriter):
        """The writer before batches overlapped: one batch at a time, each generation alone
        (`_BatchWriter.generate`), its seeds from torch's global generator, seeded per batch."""
        batches = D._Writer.batches

    monkeypatch.setattr(D, "_BatchWriter", OneAtATime)
    one = generate_data(model, tok, tmp_path / "one", cfg, progress=False, engine="batch")
    monkeypatch.undo()
    assert many == one and many["num_shards"] >= 3
    for i in range(many["num_shards"]):
        name = D.shard_path(tmp_path / "many", i).name
        assert (tmp_path / "many" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    generate_data(model, tok, tmp_path / "resumed", DataConfig(num_samples=5, **CFG), progress=False, engine="batch")
    resumed = generate_data(model, tok, tmp_path / "resumed", cfg, progress=False, engine="batch")
    assert resumed == many


def test_a_batched_set_is_extended_only_by_the_arithmetic_that_wrote_it(tiny, tmp_path):
    """The batched writer records how its matrices were computed (AMX tiles and AVX-512 sum in
    other orders, so sampled turns differ): a set written otherwise is refused with where to
    extend it, nothing written; a set written before the record existed extends as it was."""
    import mtpspec
    from mtpspec.core import fused

    model, tok = tiny
    here = fused.matmuls(mtpspec.Target(model))
    m = generate_data(model, tok, tmp_path, DataConfig(num_samples=2, **CFG), progress=False, engine="batch")
    assert m["settings"]["generation"]["matmuls"] == here
    path = tmp_path / "manifest.json"
    written = json.loads(path.read_text())
    other = "amx" if here != "amx" else "avx512"
    path.write_text(json.dumps({**written, "settings": {**written["settings"], "generation": {
        **written["settings"]["generation"], "matmuls": other}}}))
    shards = sorted(p.name for p in tmp_path.glob("shard_*"))
    with pytest.raises(DataError, match=f"written with .*{'AMX' if other == 'amx' else 'AVX-512'}.*another --out"):
        generate_data(model, tok, tmp_path, DataConfig(num_samples=6, **CFG), progress=False, engine="batch")
    assert sorted(p.name for p in tmp_path.glob("shard_*")) == shards
    legacy = {k: v for k, v in written["settings"]["generation"].items() if k != "matmuls"}
    path.write_text(json.dumps({**written, "settings": {**written["settings"], "generation": legacy}}))
    grown = generate_data(model, tok, tmp_path, DataConfig(num_samples=6, **CFG), progress=False, engine="batch")
    assert grown["num_samples"] >= 6 and grown["settings"]["generation"] == legacy


def test_a_set_keeps_the_engine_that_started_it(tiny, tmp_path):
    from mtpspec.training.data import recorded_engine

    model, tok = tiny
    generate_data(model, tok, tmp_path, DataConfig(num_samples=2, **CFG), progress=False, engine="hf")
    generate_data(model, tok, tmp_path, DataConfig(num_samples=4, **CFG), progress=False, engine="batch")
    assert recorded_engine(tmp_path) == "hf"
    with pytest.raises(InputError, match="engine"):
        generate_data(model, tok, tmp_path / "x", DataConfig(num_samples=2, **CFG), progress=False, engine="vllm")
