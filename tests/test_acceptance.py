"""`mtpspec acceptance`: per-category, per-k, per-temperature acceptance tables."""

from __future__ import annotations

import json

from conftest import save_tiny_model_dir
from typer.testing import CliRunner

from mtpspec import MTPHead
from mtpspec.cli import app


def test_acceptance_table_covers_every_category_k_and_temperature(tmp_path):
    model, _ = save_tiny_model_dir(tmp_path / "m")
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [f"w{7 + i} w9 w10"]})
                                 for i, c in enumerate(["qa", "qa", "code"])) + "\n")
    r = CliRunner().invoke(app, ["acceptance", "--target", str(tmp_path / "m"), "--head", str(tmp_path / "head"),
                                 "--prompts", str(prompts), "--num-draft-tokens", "1,3", "--temperatures", "0,1.0", "-n", "6",
                                 "--out", str(tmp_path / "acc.json")])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "acc.json").read_text())
    keys = {(x["k"], x["temperature"], x["category"]) for x in rows}
    assert keys == {(k, t, c) for k in (1, 3) for t in (0.0, 1.0) for c in ("qa", "code", "all")}
    for x in rows:
        assert 1.0 <= x["mean_accepted"] <= x["k"] + 1 and len(x["position_acceptance"]) == x["k"]
        if x["category"] == "all":
            parts = [y for y in rows if (y["k"], y["temperature"]) == (x["k"], x["temperature"]) and y["category"] != "all"]
            assert x["prompts"] == sum(y["prompts"] for y in parts) == 3
            assert x["new_tokens"] == sum(y["new_tokens"] for y in parts)
            # merged rounds: the overall rate is a weighted mean of the categories' rates
            means = [y["mean_accepted"] for y in parts]
            assert min(means) - 1e-3 <= x["mean_accepted"] <= max(means) + 1e-3
    assert "| qa | 2 |" in r.stdout and "temperature 1" in r.stdout


def test_acceptance_bad_ks_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(app, ["acceptance", "-k", "0"])
    assert r.exit_code == 2 and "--num-draft-tokens" in r.stderr


def test_acceptance_over_a_data_set_decodes_the_prompts_its_target_saw(tmp_path, monkeypatch):
    """A data directory as --prompts: the picked samples (evenly spread by --limit) are decoded
    from their stored prompt ids exactly, with no chat template put around them again."""
    from dataclasses import asdict

    from conftest import write_tiny_data

    import mtpspec.cli as cli_mod
    import mtpspec.measure.acceptance as acc_mod
    from mtpspec.core.target import Target
    from mtpspec.training.shards import load_samples

    model, _ = save_tiny_model_dir(tmp_path / "m")
    data = write_tiny_data(model, tmp_path / "data", n=6, prompt_len=5, new=8)
    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "target": asdict(Target(model).identity())}))
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    seen = []

    def recording(target, head, prompts, inputs, *args, **kwargs):
        seen.extend(inputs)
        return real(target, head, prompts, inputs, *args, **kwargs)

    real = acc_mod.measure_acceptance
    # the CLI holds its own reference (it reads the function's defaults for its options)
    monkeypatch.setattr(cli_mod, "measure_acceptance", recording)
    r = CliRunner().invoke(app, ["acceptance", "--target", str(tmp_path / "m"), "--head", str(tmp_path / "head"),
                                 "--prompts", str(data), "--limit", "3", "-k", "2", "-n", "4", "--threads", "1"])
    assert r.exit_code == 0, r.output
    stored = [ids[:n].tolist() for ids, n in load_samples(data)]
    assert [x.tolist() for x in seen] == [stored[0], stored[2], stored[4]]
    assert "| short | 3 |" in r.stdout


def test_acceptance_of_trees_counts_per_round_and_a_width_one_tree_is_the_chain():
    """`measure_acceptance(tree=...)`: every run drafts from a fresh TreeDrafter; a tree of width
    and beam 1 is the head's greedy chain, so its rows equal the chain's row for row; any tree
    emits the same greedy text as the chain (the same new tokens)."""
    import torch
    from conftest import tiny_model

    from mtpspec.core.drafters import TreeConfig
    from mtpspec.core.target import Target
    from mtpspec.measure.acceptance import measure_acceptance
    from mtpspec.prompts import Prompt

    model = tiny_model("llama")
    t = Target(model)
    head = MTPHead.for_target(t)
    prompts = [Prompt(f"p{i}", "qa" if i % 2 else "code", "") for i in range(3)]
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randint(4, 97, (1, 6 + 3 * i), generator=gen) for i in range(3)]

    def run(tree):
        rows = measure_acceptance(t, head, prompts, inputs, [3], [0.0], max_new_tokens=12, progress=False, tree=tree)
        return {r.category: r for r in rows}

    chain, narrow, wide = run(None), run(TreeConfig(width=1, beam=1, max_depth=None)), run(TreeConfig(width=3, beam=2))
    assert set(chain) == {"qa", "code", "all"} and {r.drafter for r in narrow.values()} == {"tree"}
    for c in chain:
        a, b = chain[c].stats, narrow[c].stats
        assert (a.rounds, a.accept_hist, a.pos_checked, a.pos_passed) == (b.rounds, b.accept_hist, b.pos_checked, b.pos_passed)
        assert wide[c].stats.new_tokens == a.new_tokens and wide[c].to_dict()["drafter"] == "tree"
    # a depth counts once per round however many nodes it holds: at most max_depth positions
    assert len(wide["all"].stats.position_acceptance) <= 3


def test_acceptance_tree_cli_writes_tree_rows_that_costs_refuses(tmp_path):
    model, _ = save_tiny_model_dir(tmp_path / "m")
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 0, "category": "qa", "turns": ["w7 w9 w10"]}) + "\n")
    base = ["acceptance", "--target", str(tmp_path / "m"), "--head", str(tmp_path / "head"), "--prompts", str(prompts),
            "-n", "6", "--threads", "1", "--tree"]
    r = CliRunner().invoke(app, base + ["--tree-shape", "fixed", "--out", str(tmp_path / "acc.json")])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "acc.json").read_text())
    assert {(x["k"], x["drafter"], x["category"]) for x in rows} == {(8, "tree", "qa"), (8, "tree", "all")}
    assert "a tree of at most N nodes per round" in r.stdout and "| N=8 |" in r.stdout
    for x in rows:  # a depth no round reached is told apart from one that never passed
        assert len(x["position_checked"]) == len(x["position_acceptance"]) and x["position_checked"][0] > 0
        assert all(a == 0.0 for a, c in zip(x["position_acceptance"], x["position_checked"]) if c == 0)
    r = CliRunner().invoke(app, ["costs", "--target", str(tmp_path / "m"), "--acceptance", str(tmp_path / "acc.json")])
    assert r.exit_code == 2 and "tree rows only" in r.output
    r = CliRunner().invoke(app, base + ["--tree-shape", "round"])
    assert r.exit_code == 2 and "--tree-shape must be one of cost, fixed" in r.output
