"""Self-distillation data: the target writes prompts and answers; runs resume exactly."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_tiny_model_dir
from safetensors.torch import load_file

from mtpspec.errors import DataError, InputError
from mtpspec.training.data import DataConfig, generate_data, is_degenerate, load_samples, read_prompts_file

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
    assert m["num_samples"] == 6 and m["target"]["architecture"] == "llama"
    samples = load_samples(tmp_path)
    assert len(samples) == 6
    for ids, pl in samples:
        assert 0 < pl < ids.shape[0]
        # the prompt is the chat template around a user turn: it starts with the template's w4
        assert tok.decode(ids[:pl]).startswith("w4")


def test_resume_extends_exactly_like_one_run(tiny, tmp_path):
    model, tok = tiny
    generate_data(model, tok, tmp_path / "one", DataConfig(num_samples=8, **CFG), progress=False)
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=3, **CFG), progress=False)
    generate_data(model, tok, tmp_path / "two", DataConfig(num_samples=8, **CFG), progress=False)
    a, b = load_samples(tmp_path / "one"), load_samples(tmp_path / "two")
    assert len(a) == len(b) == 8
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    # no prompt appears twice
    prompts = [tuple(s[0][: s[1]].tolist()) for s in b]
    assert len(set(prompts)) == len(prompts)


def test_other_settings_in_same_dir_are_refused(tiny, tmp_path):
    model, tok = tiny
    generate_data(model, tok, tmp_path, DataConfig(num_samples=2, **CFG), progress=False)
    with pytest.raises(DataError, match="other settings"):
        generate_data(model, tok, tmp_path, DataConfig(num_samples=4, **{**CFG, "seed": 9}), progress=False)


def test_prompts_file_sources(tiny, tmp_path):
    model, tok = tiny
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"turns": ["w9 w10 w11"]}) + "\n" + json.dumps({"prompt": "w12 w13"}) + "\n")
    assert read_prompts_file(f) == ["w9 w10 w11", "w12 w13"]
    m = generate_data(model, tok, tmp_path / "out", DataConfig(num_samples=4, **CFG), prompts_file=str(f),
                      progress=False)
    assert m["num_samples"] == 4
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


def test_no_chat_template_is_refused_before_anything_is_written(tiny, tmp_path):
    import copy

    model, tok = tiny
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    with pytest.raises(InputError, match="has no chat template"):
        generate_data(model, plain, tmp_path / "out", DataConfig(num_samples=2, **CFG), progress=False)
    assert not (tmp_path / "out").exists()


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
    (d / "shard_00000.safetensors").write_bytes(b"not a shard")
    with pytest.raises(DataError, match="shard_00000.safetensors is missing or unreadable"):
        load_samples(d)
    (d / "shard_00000.safetensors").unlink()
    with pytest.raises(DataError, match="shard_00000.safetensors is missing or unreadable"):
        load_samples(d)


def test_degenerate_filter():
    assert is_degenerate([5, 5, 5, 5, 5, 5, 5, 5, 5, 6])
    assert is_degenerate([1, 2])
    assert is_degenerate([1, 2, 3, 4] * 10)
    assert not is_degenerate(list(range(10, 60)))
