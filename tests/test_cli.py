"""The CLI on a tiny local model: real runs through typer's runner, no network."""

from __future__ import annotations

import json

import pytest
from conftest import hf_greedy, save_tiny_model_dir
from typer.testing import CliRunner

from mtpspec import MTPHead
from mtpspec.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model, tok = save_tiny_model_dir(d)
    return d, model, tok


def test_generate_json_matches_hf_greedy(model_dir):
    d, model, tok = model_dir
    r = runner.invoke(app, ["generate", "--target", str(d), "--prompt", "w7 w8 w9", "-n", "12", "-k", "3",
                            "--fresh-head", "--json"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    ids = tok.apply_chat_template([{"role": "user", "content": "w7 w8 w9"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    ref = hf_greedy(model, ids, 12, eos=3)[0, ids.shape[1]:].tolist()
    assert obj["token_ids"] == ref
    assert obj["stats"]["new_tokens"] == len(ref) and obj["num_draft_tokens"] == 3
    assert "freshly initialised head" in r.stderr


def test_generate_streams_text_and_stats(model_dir, tmp_path):
    d, model, _ = model_dir
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    r = runner.invoke(app, ["generate", "--target", str(d), "--head", str(tmp_path / "head"), "--prompt", "w7",
                            "-n", "8", "--compare"])
    assert r.exit_code == 0, r.output
    assert "tokens per target forward" in r.stdout and "outputs identical" in r.stdout
    assert "freshly initialised" not in r.stderr


def test_sampling_flags_are_reproducible(model_dir):
    d, _, _ = model_dir
    args = ["generate", "--target", str(d), "--prompt", "w7", "-n", "10", "--fresh-head", "--json",
            "--temperature", "1.0", "--top-k", "20", "--top-p", "0.9"]
    a = json.loads(runner.invoke(app, args + ["--seed", "1"]).stdout.strip().splitlines()[-1])
    b = json.loads(runner.invoke(app, args + ["--seed", "1"]).stdout.strip().splitlines()[-1])
    assert a["token_ids"] == b["token_ids"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "/no/such/model"], "not found"),
        (["--head", "/no/such/head"], "not a saved mtpspec head"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--dtype", "fp8"], "Unknown dtype"),
    ],
)
def test_user_errors_are_one_line_exit_2(model_dir, args, message):
    d, _, _ = model_dir
    base = ["generate", "--prompt", "w7", "-n", "4"]
    if "--target" not in args:
        base += ["--target", str(d)]
    r = runner.invoke(app, base + args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_head_for_another_target_is_refused(model_dir, tmp_path):
    d, _, _ = model_dir
    from conftest import tiny_model

    MTPHead.for_target(tiny_model("llama", seed=5)).save_pretrained(tmp_path / "other")
    r = runner.invoke(app, ["generate", "--target", str(d), "--head", str(tmp_path / "other"), "--prompt", "w7"])
    assert r.exit_code == 2 and "different target" in r.stderr


def test_costs_picks_k_from_acceptance_and_saves_it_in_the_head(model_dir, tmp_path):
    d, model, _ = model_dir
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    rates = [{"k": 3, "temperature": 0.0, "category": "all", "position_acceptance": [0.99, 0.99, 0.99]},
             {"k": 3, "temperature": 0.0, "category": "qa", "position_acceptance": [0.0, 0.0, 0.0]}]
    (tmp_path / "acc.json").write_text(json.dumps(rates))
    base = ["costs", "--target", str(d), "--head", str(tmp_path / "head"), "--max-n", "4", "--context", "8", "--reps", "2"]
    r = runner.invoke(app, base + ["--acceptance", str(tmp_path / "acc.json"), "--save-k", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out["predicted_speedup"]) == {"1", "2", "3"}
    top = max(out["predicted_speedup"], key=lambda k: out["predicted_speedup"][k])
    assert out["best_k"] == (int(top) if out["predicted_speedup"][top] > 1.0 else 0)
    saved = json.loads((tmp_path / "head" / "mtp_head.json").read_text())["recommended_k"]
    assert saved == {"float32": out["best_k"]}
    assert MTPHead.from_pretrained(tmp_path / "head", model).recommended_k == {"float32": out["best_k"]}
    # the choice needs its evidence; a file without a greedy all-categories row is refused
    r = runner.invoke(app, base + ["--save-k"])
    assert r.exit_code == 2 and "--acceptance" in r.output
    (tmp_path / "bad.json").write_text(json.dumps(rates[1:]))
    r = runner.invoke(app, base + ["--acceptance", str(tmp_path / "bad.json")])
    assert r.exit_code == 2 and "all-categories" in r.output
