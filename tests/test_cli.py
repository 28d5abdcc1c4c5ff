"""The CLI on a tiny local model: real runs through typer's runner, no network."""

from __future__ import annotations

import json

import pytest
from conftest import hf_greedy, save_tiny_model_dir
from typer.testing import CliRunner

from mtpspec import MTPHead
from mtpspec.cli import app
from mtpspec.core.drafters import SWITCH_TOKENS, TREE_NODES

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


def test_generate_switch_and_tree_match_hf_greedy_and_refuse_each_other(model_dir):
    d, model, tok = model_dir
    prompt = "w7 w8 w9 w7 w8 w9 w7 w8"  # repeats: the lookup has something to propose
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    ref = hf_greedy(model, ids, 12, eos=3)[0, ids.shape[1]:].tolist()
    for flag, k in (("--switch", SWITCH_TOKENS), ("--tree", TREE_NODES)):
        r = runner.invoke(app, ["generate", "--target", str(d), "--prompt", prompt, "-n", "12", "--fresh-head", "--json",
                                "--dtype", "fp32", flag])  # fp32: mtpspec equals HF greedy
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout.strip().splitlines()[-1])
        assert obj["token_ids"] == ref and obj["num_draft_tokens"] == k, flag
    r = runner.invoke(app, ["generate", "--target", str(d), "--prompt", "w7", "--fresh-head", "--switch", "--tree"])
    assert r.exit_code == 2 and "choose one" in r.output


def test_generate_tree_and_the_cli_tree_draft_the_same_trees(model_dir, tmp_path, monkeypatch):
    """`mtpspec generate --tree` and `mtpspec.generate(tree=True)` get their drafter from one
    factory: on the same head and prompt they draft the same trees (budget, shape, nodes), round
    by round."""
    import mtpspec
    from mtpspec.core.drafters import TreeDrafter
    from mtpspec.models import chat_ids, load_target

    d, model, tok = model_dir
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    rounds: list = []
    propose = TreeDrafter.propose

    def spy(self, inp, k, sampling, generator):
        draft = propose(self, inp, k, sampling, generator)
        rounds.append((k, self.config, draft.parent_list(), draft.tokens.tolist()))
        return draft

    monkeypatch.setattr(TreeDrafter, "propose", spy)
    prompt = "w7 w8 w9 w7 w8"
    r = runner.invoke(app, ["generate", "--target", str(d), "--head", str(tmp_path / "head"), "--prompt", prompt,
                            "-n", "16", "--tree", "--dtype", "fp32", "--json"])
    assert r.exit_code == 0, r.output
    cli, rounds[:] = list(rounds), []
    target = mtpspec.Target(load_target(str(d), "fp32").model)
    mtpspec.generate(target, MTPHead.from_pretrained(tmp_path / "head", target), chat_ids(tok, prompt), max_new_tokens=16,
                     tree=True)
    assert rounds == cli
    assert any(len(parents) > len(set(parents)) for _, _, parents, _ in cli)  # some round drafted a real tree


def test_generate_streams_text_and_stats(model_dir, tmp_path):
    d, model, _ = model_dir
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    r = runner.invoke(app, ["generate", "--target", str(d), "--head", str(tmp_path / "head"), "--prompt", "w7",
                            "-n", "8", "--compare"])
    assert r.exit_code == 0, r.output
    assert "tokens per target forward" in r.stdout and "outputs identical" in r.stdout
    assert "freshly initialised" not in r.stderr


def test_sampling_flags_reach_generate(model_dir, monkeypatch):
    """Every sampling flag arrives, unchanged, at `mtpspec.generate` (a flag the CLI dropped would
    leave its default there), and the printed tokens are what generate returned."""
    import mtpspec

    d, _, _ = model_dir
    calls = []
    real = mtpspec.generate

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(mtpspec, "generate", spy)
    r = runner.invoke(app, ["generate", "--target", str(d), "--prompt", "w7", "-n", "10", "-k", "2", "--fresh-head",
                            "--json", "--temperature", "2.0", "--top-k", "5", "--top-p", "0.6", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1
    assert {k: calls[0][k] for k in ("temperature", "top_k", "top_p", "seed", "num_draft_tokens", "max_new_tokens")} == \
        {"temperature": 2.0, "top_k": 5, "top_p": 0.6, "seed": 1, "num_draft_tokens": 2, "max_new_tokens": 10}


def test_a_relaxed_rule_reaches_generate_and_every_output_says_so(model_dir, monkeypatch):
    import mtpspec
    from mtpspec import AcceptanceConfig

    d, _, _ = model_dir
    calls = []
    real = mtpspec.generate
    monkeypatch.setattr(mtpspec, "generate", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    base = ["generate", "--target", str(d), "--prompt", "w7", "-n", "10", "-k", "2", "--fresh-head"]
    r = runner.invoke(app, [*base, "--json", "--acceptance", "topm:3,0.2"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert calls[0]["acceptance"] == AcceptanceConfig(rule="topm", m=3, alpha=0.2)
    assert obj["acceptance"] == obj["stats"]["acceptance"] == "topm:3,0.2" and obj["exact"] is False
    r = runner.invoke(app, [*base, "--acceptance", "typical:0.09", "--compare"])
    assert r.exit_code == 0 and "relaxed acceptance typical:0.09:" in r.stdout
    r = runner.invoke(app, [*base, "--json"])  # the default: exact, and it says so
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert obj["acceptance"] == obj["stats"]["acceptance"] == "exact" and obj["exact"] is True


def test_a_seed_makes_sampling_reproducible_and_sampling_is_not_greedy(model_dir):
    d, _, _ = model_dir
    base = ["generate", "--target", str(d), "--prompt", "w7", "-n", "10", "-k", "0", "--fresh-head", "--json"]
    sampled = base + ["--temperature", "2.0", "--seed", "1"]
    a, b, greedy = (json.loads(runner.invoke(app, args).stdout.strip().splitlines()[-1])["token_ids"]
                    for args in (sampled, sampled, base))
    assert a == b and a != greedy


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
    base = ["costs", "--target", str(d), "--head", str(tmp_path / "head"), "--max-n", "4", "--context", "8", "--reps", "2",
            "--dtype", "fp32", "--bandwidth-mib", "16"]  # a small buffer: the bandwidth has its own tests (test_costs.py)
    r = runner.invoke(app, base + ["--acceptance", str(tmp_path / "acc.json"), "--save-k", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out["predicted_speedup"]) == {"1", "2", "3"} and out["memory"] is not None
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


# -- data and train -------------------------------------------------------------------------------
def _prompts_txt(path, n: int = 30):
    """Distinct prompts: the tiny target rarely ends a self-written turn, so these carry the data."""
    path.write_text("".join(f"w{10 + i} w{40 + i} w{70 + i % 20}\n" for i in range(n)))
    return path


DATA_FLAGS = ["--num-samples", "6", "--batch-size", "4", "--max-prompt-tokens", "6", "--max-response-tokens", "10",
              "--dtype", "fp32", "--threads", "1"]


def test_data_then_train_then_generate(model_dir, tmp_path):
    from mtpspec.training.shards import load_samples

    d, model, tok = model_dir
    prompts = _prompts_txt(tmp_path / "prompts.txt")
    r = runner.invoke(app, ["data", "--target", str(d), "--out", str(tmp_path / "data"),
                            "--prompts-file", str(prompts), "--document-share", "0", "--follow-up-share", "0", *DATA_FLAGS])
    assert r.exit_code == 0, r.output
    samples = load_samples(tmp_path / "data")
    assert len(samples) == 6 and r.stdout.startswith("6 samples")  # batches of 4 seeds: two, all answered
    given = set(prompts.read_text().splitlines())
    for ids, prompt_len in samples:  # chat template around one of the given prompts, then the target's reply
        text = tok.decode(ids[:prompt_len])
        assert text.startswith("w4") and text.endswith("w6") and any(g in text for g in given)

    run = tmp_path / "run"
    r = runner.invoke(app, ["train", "--min-steps", "0", "--target", str(d), "--data", str(tmp_path / "data"), "--out", str(run),
                            "--max-draft-tokens", "2", "--hidden-layers", "-2,-1", "--epochs", "1", "--batch-size", "2",
                            "--lr", "0.002", "--warmup-steps", "1", "--holdout", "0", "--no-bf16", "--cache-dtype", "fp32",
                            "--threads", "1"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["step"] == result["total_steps"] == 3  # 6 samples, batches of 2, one epoch
    import torch

    flags = torch.load(run / "checkpoint.pt", weights_only=False)["train_config"]
    assert (flags["kind"], flags["max_draft_tokens"], flags["lr"], flags["bf16"]) == ("mtp", 2, 0.002, False)
    head = MTPHead.from_pretrained(run / "head", model)
    assert head.config.trained_draft_tokens == 2 and head.config.hidden_layers == (-2, -1)
    r = runner.invoke(app, ["generate", "--target", str(d), "--head", str(run / "head"), "--prompt", "w7", "-n", "6",
                            "-k", "2", "--json"])
    assert r.exit_code == 0, r.output
    # DIR:1, the set's first shard, in the same run directory: its cache serves it as it is
    first = len(load_samples(tmp_path / "data", shards=1))
    stamp = (run / "activations" / "activations.json").stat().st_mtime_ns
    r = runner.invoke(app, ["train", "--min-steps", "0", "--target", str(d), "--data", f"{tmp_path / 'data'}:1", "--out", str(run),
                            "--max-draft-tokens", "2", "--hidden-layers", "-2,-1", "--epochs", "1", "--batch-size", "2",
                            "--holdout", "0", "--no-bf16", "--cache-dtype", "fp32", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert 0 < first < 6 and json.loads(r.stdout.strip().splitlines()[-1])["total_steps"] == first // 2
    assert (run / "activations" / "activations.json").stat().st_mtime_ns == stamp


def test_data_dtype_auto_extends_a_set_in_its_own_dtype(model_dir, tmp_path):
    """--dtype auto (the default) resumes a set in the dtype it was written in, whatever this
    CPU would pick for a new one; an explicit other dtype is refused, naming the setting."""
    d, _, _ = model_dir
    prompts = _prompts_txt(tmp_path / "prompts.txt")
    flags = ["data", "--target", str(d), "--out", str(tmp_path / "data"), "--prompts-file", str(prompts),
             "--document-share", "0", "--follow-up-share", "0", "--batch-size", "2", "--max-prompt-tokens", "6",
             "--max-response-tokens", "6", "--threads", "1"]
    r = runner.invoke(app, [*flags, "--num-samples", "2", "--dtype", "bf16"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*flags, "--num-samples", "4"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert m["settings"]["dtype"] == "bfloat16" and m["num_samples"] >= 4
    r = runner.invoke(app, [*flags, "--num-samples", "6", "--dtype", "fp32"])
    assert r.exit_code == 2 and "dtype: was 'bfloat16', now 'float32'" in r.output


@pytest.mark.parametrize("native", [False, True])
def test_train_autocast_defaults_to_the_cpus_bf16(model_dir, tmp_path, monkeypatch, native):
    """Without --bf16/--no-bf16, training autocasts to bf16 only where bf16 matmuls are native
    (on an AVX2-only CPU they are emulated, several times slower than fp32)."""
    import torch

    d, _, _ = model_dir
    monkeypatch.setattr("mtpspec.models.auto_dtype", lambda: torch.bfloat16 if native else torch.float32)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    prompts = _prompts_txt(tmp_path / "prompts.txt")
    r = runner.invoke(app, ["data", "--target", str(d), "--out", str(tmp_path / "data"), "--prompts-file", str(prompts),
                            "--document-share", "0", "--follow-up-share", "0", *DATA_FLAGS])
    assert r.exit_code == 0, r.output
    run = tmp_path / "run"
    r = runner.invoke(app, ["train", "--min-steps", "0", "--target", str(d), "--data", str(tmp_path / "data"), "--out", str(run),
                            "--max-draft-tokens", "2", "--epochs", "1", "--batch-size", "2", "--holdout", "0",
                            "--cache-dtype", "fp32", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert torch.load(run / "checkpoint.pt", weights_only=False)["train_config"]["bf16"] is native


def test_base_model_head_end_to_end(tmp_path):
    """A model without a chat template: continuation data, a trained head, then generation and
    acceptance through the CLI, each step reading what the one before wrote."""
    from mtpspec.training.shards import load_samples

    d = tmp_path / "base"
    save_tiny_model_dir(d)
    (d / "chat_template.jinja").unlink()
    r = runner.invoke(app, ["data", "--target", str(d), "--out", str(tmp_path / "data"), *DATA_FLAGS])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["settings"]["recipe"] == "continuation"
    samples = load_samples(tmp_path / "data")
    assert len(samples) >= 6 and all(0 < pl < len(ids) for ids, pl in samples)
    run = tmp_path / "run"
    r = runner.invoke(app, ["train", "--min-steps", "0", "--target", str(d), "--data", str(tmp_path / "data"), "--out", str(run),
                            "--max-draft-tokens", "2", "--epochs", "1", "--batch-size", "2", "--holdout", "0",
                            "--no-bf16", "--cache-dtype", "fp32", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert (run / "head" / "mtp_head.safetensors").is_file()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "code", "turns": [f"w{10 + i} w{40 + i}"]}) + "\n" for i in range(3)))
    r = runner.invoke(app, ["acceptance", "--target", str(d), "--head", str(run / "head"), "--prompts", str(prompts),
                            "-k", "2", "-n", "8", "--threads", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["generate", "--target", str(d), "--head", str(run / "head"), "--prompt", "w7 w8", "-n", "6",
                            "-k", "2", "--compare"])
    assert r.exit_code == 0 and "identical" in r.output, r.output


def test_train_a_draft_model(model_dir, tmp_path):
    from conftest import write_tiny_data

    d, model, _ = model_dir
    write_tiny_data(model, tmp_path / "data", n=4, new=10)
    run = tmp_path / "run"
    r = runner.invoke(app, ["train", "--min-steps", "0", "--target", str(d), "--data", str(tmp_path / "data"), "--out", str(run),
                            "--kind", "draft-model", "--draft-model-hidden", "16", "--draft-model-layers", "1",
                            "--epochs", "1", "--batch-size", "2", "--holdout", "0", "--no-bf16", "--cache-dtype", "fp32"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((run / "draft_model" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (16, 1, 97)
    assert not (run / "head").exists()
    # started from the target: its width and first layer, trained from there
    r = runner.invoke(app, ["train", "--min-steps", "0", "--target", str(d), "--data", str(tmp_path / "data"), "--out",
                            str(tmp_path / "run2"), "--kind", "draft-model", "--draft-model-init", "target",
                            "--draft-model-hidden", str(model.config.hidden_size), "--draft-model-layers", "1",
                            "--epochs", "1", "--batch-size", "2", "--holdout", "0", "--no-bf16", "--cache-dtype", "fp32"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "run2" / "draft_model" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (model.config.hidden_size, 1)
    r = runner.invoke(app, ["train", "--target", str(d), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run3"),
                            "--kind", "draft-model", "--draft-model-init", "target", "--draft-model-hidden", "7"])
    assert r.exit_code == 2 and "error:" in r.output and "--draft-model-hidden must be its width" in r.output


# -- bad input: one `error:` line, exit 2, for every command ---------------------------------------
@pytest.fixture(scope="module")
def bad_inputs(model_dir, tmp_path_factory):
    """Missing and damaged files of every kind a command reads."""
    d, model, _ = model_dir
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "bad.jsonl").write_text('{"turns": ["w7"]}\n{not json\n')
    (tmp / "no_data").mkdir()
    (tmp / "bad_data").mkdir()
    (tmp / "bad_data" / "manifest.json").write_text('{"num_shards": ')
    (tmp / "not_json.json").write_text("[{")
    MTPHead.for_target(model).save_pretrained(tmp / "bad_head")
    (tmp / "bad_head" / "mtp_head.json").write_text('{"format_version": 1, ')
    MTPHead.for_target(model).save_pretrained(tmp / "bad_weights")
    (tmp / "bad_weights" / "mtp_head.safetensors").write_bytes(b"\0" * 16)
    from conftest import write_tiny_data

    write_tiny_data(model, tmp / "data", n=2, new=4)
    nochat = tmp / "nochat"
    save_tiny_model_dir(nochat)
    (nochat / "chat_template.jinja").unlink()
    return {"target": str(d), "tmp": tmp, "nochat": str(nochat)}


BAD = [
    # generate
    ("generate --prompt w7 --head {tmp}/no_head", "not a saved mtpspec head"),
    ("generate --prompt w7 --head {tmp}/bad_head", "bad_head is not a readable mtpspec head"),
    ("generate --prompt w7 --head {tmp}/bad_weights", "bad_weights is not a readable mtpspec head"),
    ("generate --prompt w7 --acceptance lenient", "acceptance rule must be one of exact, typical, topm, entropy"),
    ("generate --prompt w7 --acceptance typical:2", "typical acceptance needs 0 < eps <= 1"),
    # data
    ("data --out {tmp}/o1 --prompts-file {tmp}/missing.txt", "missing.txt does not exist"),
    ("data --out {tmp}/o2 --prompts-file {tmp}/bad.jsonl", "bad.jsonl:2 is not valid JSON"),
    ("data --out {tmp}/o3 --corpus {tmp}/missing.txt", "Corpus file"),
    ("data --out {tmp}/o4 --target {nochat} --recipe chat", "has no chat template"),
    ("data --out {tmp}/o5 --passages {tmp}/missing", "missing does not exist"),
    ("data --out {tmp}/o6 --target {nochat} --passages {tmp}/bad.jsonl", "takes raw text as --corpus"),
    ("data --out {tmp}/bad.jsonl", "bad.jsonl is a file"),
    # train
    ("train --data {tmp}/missing --out {tmp}/r1", "is not an mtpspec data directory"),
    ("train --data {tmp}/no_data --out {tmp}/r2", "is not an mtpspec data directory"),
    ("train --data {tmp}/bad_data --out {tmp}/r3", "manifest.json is not valid JSON"),
    ("train --data {tmp}/data:2 --out {tmp}/r8", ":N` takes N from 1 to 1, not 2"),
    ("train --data {tmp}/data --out {tmp}/r6 --init-head {tmp}/bad_head", "bad_head is not a readable mtpspec head"),
    ("train --data {tmp}/data --out {tmp}/r7 --init-head {tmp}/no_head", "not a saved mtpspec head"),
    ("train --data {tmp}/no_data --out {tmp}/r4 --hidden-layers -1,x", "--hidden-layers must be comma-separated ints"),
    ("train --data {tmp}/no_data --out {tmp}/r5 --kind independent", "kind must be one of mtp, draft-model"),
    # costs
    ("costs --head {tmp}/no_head", "not a saved mtpspec head"),
    ("costs --acceptance {tmp}/missing.json", "missing.json does not exist"),
    ("costs --acceptance {tmp}/not_json.json", "not_json.json is not valid JSON"),
    # bench
    ("bench --prompts {tmp}/missing.jsonl", "not found"),
    ("bench --prompts {tmp}/bad.jsonl", "line 2"),
    ("bench --head {tmp}/bad_head --methods mtp", "bad_head is not a readable mtpspec head"),
    ("bench --draft-model {tmp}/no_data --methods assisted", "is not a saved Hugging Face model directory"),
    ("bench --methods hf,medusa", "Unknown method(s) medusa"),
    ("bench --sweep 1,x", "--sweep must be comma-separated ints"),
    ("bench -k 0", "--num-draft-tokens must be >= 1"),
    ("bench --methods k0,mtp-relaxed --acceptance topm:1.5", "whole m >= 0"),
    ("bench --methods k0,mtp-relaxed --acceptance exact", "mtp-relaxed needs a relaxed rule"),
    # acceptance
    ("acceptance --prompts {tmp}/missing.jsonl", "not found"),
    ("acceptance --prompts {tmp}/data", "written by another target"),
    ("acceptance --prompts {tmp}/no_data", "is not an mtpspec data directory"),
    ("acceptance --head {tmp}/bad_head", "bad_head is not a readable mtpspec head"),
    ("acceptance -k 1,0", "--num-draft-tokens values must be >= 1"),
    ("acceptance --tree -k 8,16", "--num-draft-tokens values must be <= 15"),
    ("acceptance --tree --tree-shape fixed --tree-floor 2", "min_branch_prob must be in [0, 1]"),
    ("acceptance --tree-shape fixed", "add --tree"),
    ("acceptance --temperatures 0,hot", "--temperatures must be comma-separated floats"),
    # shared flags
    ("generate --prompt w7 --target /no/such/model", "not found"),
    ("generate --prompt w7 --temperature -1", "temperature must be >= 0"),
    ("generate --prompt w7 --dtype fp8", "Unknown dtype"),
    ("costs --threads -1", "--threads must be >= 0"),
]


@pytest.mark.parametrize("command, message", BAD, ids=[c.split(" --")[0] + ": " + m for c, m in BAD])
def test_bad_input_is_one_error_line_and_exit_2(bad_inputs, command, message):
    args = command.format(**bad_inputs).split()
    if "--target" not in args:
        args += ["--target", bad_inputs["target"]]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert "Traceback" not in r.output
    for o in ("o1", "o2", "o3", "o4", "o5", "o6", "r1", "r2", "r3", "r6", "r7", "r8"):  # refused before writing anything
        assert not (bad_inputs["tmp"] / o).exists()


FLAGS_OF = [  # (command, config, its fields without a flag of the same name and default, and why)
    ("generate", "SamplingConfig", {}),
    ("data", "DataConfig", {"require_finished_prompts": "not a user's choice"}),
    ("train", "TrainConfig", {"bf16": "--bf16 left out: on for a GPU, else the CPU's choice"}),
    ("train", "HeadConfig", {"trained_draft_tokens": "a record, not a setting"}),
    ("bench", "BenchConfig", {"sweep": "None: no sweep", "contexts": "not a user's choice"}),
    ("serve", "ServeConfig", {"model_name": "the loaded model's", "max_stop": "not a user's choice"}),
]


@pytest.mark.parametrize("command, config, exempt", FLAGS_OF, ids=[f"{c}-{k}" for c, k, _ in FLAGS_OF])
def test_each_config_field_is_a_flag_with_the_fields_own_default(command, config, exempt):
    """CLI flags map one-to-one onto config fields and take their defaults from the field, so a
    default is declared once (the config's) and a new field cannot be left without its flag."""
    import dataclasses
    import inspect

    import mtpspec.cli as cli

    params = inspect.signature(getattr(cli, command)).parameters
    cls = {"SamplingConfig": cli.SamplingConfig, "DataConfig": cli.DataConfig, "TrainConfig": cli.TrainConfig,
           "HeadConfig": cli.HeadConfig, "BenchConfig": cli.BenchConfig, "ServeConfig": cli.ServeConfig}[config]
    for f in dataclasses.fields(cls):
        if f.name in exempt:
            continue
        assert f.name in params, f"{config}.{f.name} has no flag in `mtpspec {command}`"
        text = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default  # a list flag: its text
        assert params[f.name].default.default == text, f"{config}.{f.name}"


def test_train_builds_its_configs_from_the_flags(model_dir, tmp_path, monkeypatch):
    """Every train flag reaches TrainConfig or HeadConfig unchanged (a flag the CLI dropped would
    leave the field's default there); flags left out leave the fields' defaults."""
    import mtpspec.cli as cli
    from mtpspec.config import HeadConfig, TrainConfig

    d, _, _ = model_dir
    calls = []
    monkeypatch.setattr(cli, "train_on_data", lambda data, out, cfg, hc, *a, **kw: calls.append((cfg, hc)))
    r = runner.invoke(app, ["train", "--target", str(d), "--data", str(tmp_path), "--out", str(tmp_path / "run"),
                            "--epochs", "3", "--lr", "0.01", "--no-bf16", "--copy-context", "--num-blocks", "2",
                            "--hidden-layers", "-2,-1", "--max-draft-tokens", "4", "--min-steps", "10",
                            "--warmup-fraction", "0.2"])
    assert r.exit_code == 0, r.output
    (cfg, hc), = calls
    assert cfg == TrainConfig(epochs=3, lr=0.01, bf16=False, copy_context=True, max_draft_tokens=4, min_steps=10,
                              warmup_fraction=0.2)
    assert hc == HeadConfig(num_blocks=2, hidden_layers=(-2, -1))


def test_help_shows_the_defaults_it_describes():
    """A help text's own "[default: ...]" is shown as written (not taken for markup and dropped),
    beside the defaults read from the configs."""
    r = runner.invoke(app, ["generate", "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert "[default: the head's tuned k]" in r.stdout and "[default: embedded SmolLM2-135M-Instruct]" in r.stdout
    r = runner.invoke(app, ["serve", "--help"], terminal_width=200)
    assert "[default: 16]" in r.stdout  # --max-queue: ServeConfig's
