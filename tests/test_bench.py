"""`mtpspec bench` end to end on a tiny local model: every method runs, every output equals
hf's token for token (the tiny model in fp32 is exact), and the report files are written."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_tiny_model_dir
from typer.testing import CliRunner

from mtpspec import MTPHead, Target
from mtpspec.cli import app
from mtpspec.config import TrainConfig
from mtpspec.core.drafters import SWITCH_TOKENS
from mtpspec.core.stats import DecodeStats
from mtpspec.measure.bench import BenchConfig, Method, RunOutput, run_bench
from mtpspec.prompts import Prompt, load_prompts
from mtpspec.training.train import draft_model

runner = CliRunner()
PROMPTS = [
    {"question_id": 1, "category": "chat", "turns": ["w7 w8 w9 w10", "w11"]},
    {"question_id": 2, "category": "chat", "turns": ["w20 w21"]},
    {"question_id": 3, "category": "code", "turns": ["w30 w31 w30 w31 w30"]},
    {"question_id": 4, "category": "code", "turns": ["w40"]},
]
ALL_METHODS = ["hf", "k0", "mtp", "mtp-tree", "hybrid", "switch", "assisted", "lookup", "mtp_k1", "mtp_k2"]
MTPSPEC_METHODS = ["k0", "mtp", "mtp-tree", "hybrid", "switch", "mtp_k1", "mtp_k2"]


def write_prompts(path, prompts=PROMPTS):
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    model, _ = save_tiny_model_dir(tmp / "model")
    MTPHead.for_target(model).save_pretrained(tmp / "head")
    dm = draft_model(Target(model), TrainConfig(draft_model_hidden=16))
    dm.save_pretrained(tmp / "draft_model")
    out = tmp / "report"
    r = runner.invoke(app, ["bench", "--target", str(tmp / "model"), "--head", str(tmp / "head"),
                            "--draft-model", str(tmp / "draft_model"), "--prompts", str(write_prompts(tmp / "p.jsonl")),
                            "--max-new-tokens", "8", "--reps", "1", "--warmup", "1", "-k", "3", "--sweep", "1,2",
                            "--threads", "1", "--no-progress", "--dtype", "fp32", "--tree-nodes", "5", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out, json.loads((out / "results.json").read_text()), dm


@pytest.mark.slow
def test_report_files_and_every_method(bench_run):
    out, res, _ = bench_run
    for name in ["results.json", "results.md", "speedup.png", "acceptance.png", "memory.png"]:
        assert (out / name).stat().st_size > 0, name
    assert res["methods"] == ALL_METHODS
    md = (out / "results.md").read_text()
    for m in ALL_METHODS:
        assert f"| {m} |" in md
    assert res["categories"] == ["chat", "code"]


@pytest.mark.slow
def test_every_method_is_identical_to_hf(bench_run):
    _, res, _ = bench_run
    overall = {s["method"]: s for s in res["summaries"] if s["category"] == "all"}
    for m in ALL_METHODS:
        assert overall[m]["identical"] == overall[m]["prompts"] == 4, m
    assert all(r["identical"] and r["first_diff"] is None for r in res["records"])
    assert len(res["records"]) == 4 * len(ALL_METHODS)
    for m in MTPSPEC_METHODS:
        assert overall[m]["identical_k0"] == 4, m


@pytest.mark.slow
def test_bf16_bench_is_exact_against_k0_and_prints_the_verify_cost(tmp_path):
    """In bf16 HF's methods (run in fp32 by default) may differ; mtpspec's never differ from k0."""
    model, _ = save_tiny_model_dir(tmp_path / "model")
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    out = tmp_path / "report"
    r = runner.invoke(app, ["bench", "--target", str(tmp_path / "model"), "--head", str(tmp_path / "head"),
                            "--prompts", str(write_prompts(tmp_path / "p.jsonl")), "--methods", "hf,k0,mtp,mtp-tree,hybrid",
                            "--max-new-tokens", "12", "-k", "3", "--dtype", "bf16", "--threads", "1", "--no-progress",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["info"]["dtype"] == "bfloat16" and res["info"]["hf_dtype"] == "float32"
    overall = {s["method"]: s for s in res["summaries"] if s["category"] == "all"}
    for m in ("mtp", "mtp-tree", "hybrid"):
        assert overall[m]["identical_k0"] == 4, m
        assert overall[m]["ms_per_forward"] > 0
    assert "verify forward cost in this run" in r.output and "mtp-tree" in r.output


@pytest.mark.slow
def test_forward_counts_and_acceptance(bench_run):
    _, res, _ = bench_run
    overall = {s["method"]: s for s in res["summaries"] if s["category"] == "all"}
    # Plain decoding: one target forward per new token, the prompt forward included.
    assert overall["hf"]["forwards_per_token"] == overall["k0"]["forwards_per_token"] == 1.0
    assert overall["k0"]["mean_accepted"] == 1.0 and overall["hf"]["mean_accepted"] == 1.0
    # Drafting never costs more than one target forward per token.
    for m in ALL_METHODS:
        assert overall[m]["forwards_per_token"] <= 1.0 and overall[m]["mean_accepted"] >= 1.0
    assert len(overall["mtp"]["position_acceptance"]) == 3 and len(overall["mtp_k2"]["position_acceptance"]) == 2
    assert overall["hf"]["position_acceptance"] is None
    assert res["method_k"] == {"hf": None, "k0": 0, "mtp": 3, "mtp-tree": 5, "hybrid": 5, "switch": SWITCH_TOKENS, "assisted": None,
                               "lookup": None, "mtp_k1": 1, "mtp_k2": 2}
    by_category = [s for s in res["summaries"] if s["method"] == "mtp" and s["category"] != "all"]
    assert sum(s["new_tokens"] for s in by_category) == overall["mtp"]["new_tokens"]


@pytest.mark.slow
def test_records_carry_decode_stats_for_mtpspec_methods_only(bench_run):
    _, res, _ = bench_run
    for r in res["records"]:
        if r["method"] in ("hf", "assisted", "lookup"):
            assert r["stats"] is None
        else:
            s = r["stats"]
            assert s["new_tokens"] == r["new_tokens"] and sum(s["accept_hist"]) == s["rounds"]
            assert len(s["accept_hist"]) == res["method_k"][r["method"]] + 1


@pytest.mark.slow
def test_draft_model_memory(bench_run):
    _, res, dm = bench_run
    mem = res["memory"]
    c = dm.config  # 2 layers, 1 kv head of dim 16, fp32: K and V per layer per position
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    assert mem["assisted"]["kv_bytes_per_token"] == per_token
    at = mem["assisted"]["bytes_at_context"]
    assert at["8192"] - at["512"] == per_token * (8192 - 512)
    # The MTP head owns only its weights: the same at every context length.
    assert len(set(mem["mtp"]["bytes_at_context"].values())) == 1 and mem["mtp"]["param_bytes"] > 0
    assert all(v == 0 for m in ("hf", "k0", "lookup") for v in mem[m]["bytes_at_context"].values())


@pytest.mark.slow
def test_draft_model_runs_in_mtpspecs_loop_exactly_with_its_memory_ttft_and_cpu_time(tmp_path):
    model, _ = save_tiny_model_dir(tmp_path / "model")
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    dm = draft_model(Target(model), TrainConfig(draft_model_hidden=16))
    dm.save_pretrained(tmp_path / "draft_model")
    out = tmp_path / "report"
    r = runner.invoke(app, ["bench", "--target", str(tmp_path / "model"), "--head", str(tmp_path / "head"),
                            "--draft-model", str(tmp_path / "draft_model"), "--methods", "k0,mtp,draft-model,assisted",
                            "--prompts", str(write_prompts(tmp_path / "p.jsonl")), "--max-new-tokens", "10", "-k", "3",
                            "--threads", "1", "--no-progress", "--dtype", "fp32", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    overall = {s["method"]: s for s in res["summaries"] if s["category"] == "all"}
    assert overall["draft-model"]["identical_k0"] == 4 and overall["assisted"]["identical_k0"] == 4
    assert res["method_k"]["draft-model"] == res["method_k"]["mtp"] == 3  # equally long chains
    assert len(overall["draft-model"]["position_acceptance"]) == 3 and overall["draft-model"]["ttft_s"] > 0
    # its own weights and KV cache, computed from its config, as assisted's (the same model)
    assert res["memory"]["draft-model"] == res["memory"]["assisted"]
    # the energy proxy, for every method: target forwards and process CPU seconds per new token
    for m in ("k0", "mtp", "draft-model", "assisted"):
        assert overall[m]["forwards_per_token"] > 0 and overall[m]["cpu_s_per_token"] > 0, m
    assert all(rec["cpu_seconds"] > 0 for rec in res["records"])
    assert "CPU ms/token" in (out / "results.md").read_text()


def test_draft_model_without_a_model_or_with_another_vocabulary_is_a_clear_error(tmp_path):
    model, _ = save_tiny_model_dir(tmp_path / "model")
    args = ["bench", "--target", str(tmp_path / "model"), "--methods", "k0,draft-model", "--warmup", "0",
            "--prompts", str(write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])), "--max-new-tokens", "4",
            "--no-progress", "--out", str(tmp_path / "report")]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "error: The draft-model method needs a draft model" in r.output
    assert "mtpspec train --kind draft-model" in r.output
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "dm50")
    r = runner.invoke(app, [*args, "--draft-model", str(tmp_path / "dm50")])
    assert r.exit_code == 2 and "vocabulary (50 tokens) differs from the target's (97)" in r.output


def test_assisted_without_draft_model_is_skipped_with_a_note(tmp_path):
    save_tiny_model_dir(tmp_path / "model")
    out = tmp_path / "report"
    r = runner.invoke(app, ["bench", "--target", str(tmp_path / "model"), "--methods", "hf,assisted,lookup",
                            "--prompts", str(write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])), "--warmup", "0",
                            "--max-new-tokens", "4", "--no-progress", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["methods"] == ["hf", "lookup"]
    assert "assisted: skipped" in (out / "results.md").read_text()


def test_limit_spreads_over_categories(tmp_path):
    prompts = [{"question_id": i, "category": f"c{i // 4}", "turns": [f"w{10 + i}"]} for i in range(12)]
    got = load_prompts(write_prompts(tmp_path / "p.jsonl", prompts), limit=3)
    assert [p.category for p in got] == ["c0", "c1", "c2"]
    assert len(load_prompts(None)) == 24 and len({p.category for p in load_prompts(None)}) == 6


def test_forward_counter_counts_and_always_removes_its_hook():
    import torch
    from conftest import tiny_model

    from mtpspec.measure.bench import count_forwards

    model = tiny_model()
    ids = torch.tensor([[5, 6, 7]])
    with count_forwards(model) as n:
        model(ids)
        model(ids)
    assert n[0] == 2 and not model._forward_hooks
    with pytest.raises(RuntimeError), count_forwards(model):
        raise RuntimeError("a failing run")
    assert not model._forward_hooks


# -- run_bench on scripted methods: what it computes from what the methods report ------------------
def _scripted(name: str, k: int, seconds: float, rounds: dict) -> Method:
    """A method that reports fixed tokens, time and rounds per prompt (rounds[prompt id] =
    [(drafts checked, drafts accepted), ...]) instead of decoding."""
    def run(ids: torch.Tensor) -> RunOutput:
        stats = DecodeStats.empty(k)
        for checked, accepted in rounds.get(int(ids[0, 0]), []):
            stats.record_round(checked, accepted)
        stats.new_tokens = 10
        return RunOutput(list(range(10)), seconds, None, 1 + stats.rounds if k else 10, stats if k else None)

    return Method(name, run, k=k)


def test_summaries_merge_rounds_and_best_k_is_the_fastest_mtp_method():
    prompts = [Prompt(1, "a", "w7"), Prompt(2, "b", "w8")]
    inputs = [torch.tensor([[1]]), torch.tensor([[2]])]
    rounds = {1: [(2, 2), (2, 0)], 2: [(2, 1)]}
    methods = [_scripted("hf", 0, 1.0, {}), _scripted("mtp_k1", 1, 0.8, {1: [(1, 1)], 2: [(1, 0)]}),
               _scripted("mtp_k2", 2, 0.5, rounds), _scripted("mtp_k3", 3, 0.9, {})]
    res = run_bench(BenchConfig(methods=("hf",), sweep=(1, 2, 3), warmup=0), methods, prompts, inputs, progress=False)
    assert res.best_k == 2  # 20 tokens in 1.0 s beats 1.6 s (k=1) and 1.8 s (k=3)
    s = res.summary("mtp_k2")
    # rounds accepting 2, 0 and 1 drafts: (3 + 1 + 2) / 3 tokens per verify forward
    assert s.mean_accepted == pytest.approx(2.0)
    # position 1 checked in all 3 rounds, passed in 2; position 2 checked in 2 (not after a miss), passed in 1
    assert s.position_acceptance == pytest.approx([2 / 3, 1 / 2])
    assert res.summary("mtp_k2", "a").mean_accepted == pytest.approx(2.0)  # rounds (2, 2), (2, 0): (3 + 1) / 2
    assert res.summary("hf").mean_accepted == 1.0  # no stats: new tokens per target forward
    assert res.summary("mtp_k2").forwards_per_token == pytest.approx((2 + 3) / 20)  # prefill + rounds, per token
    assert s.speedup_vs_hf == pytest.approx(2.0)


def test_llamacpp_is_skipped_with_a_note_when_missing_or_not_gguf(tmp_path, monkeypatch):
    import importlib.util

    from mtpspec.measure.bench import build_methods

    model, _ = save_tiny_model_dir(tmp_path / "model")
    cfg = BenchConfig(methods=("k0", "llamacpp"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    methods, notes = build_methods(cfg, model, gguf=tmp_path / "m.gguf")
    assert [m.name for m in methods] == ["k0"] and "llama-cpp-python is not installed" in notes[0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "llama_cpp" else real(name, *a))
    methods, notes = build_methods(cfg, model, gguf=None)
    assert [m.name for m in methods] == ["k0"] and "not a GGUF file" in notes[0]


def test_relaxed_methods_run_side_by_side_and_their_quality_is_scored(tmp_path):
    """`--methods k0,mtp,mtp-relaxed` with two rules: one method per rule, each named and labelled
    by its rule; the rule at its limit is k0's output (nothing changed, edit distance 0, the same
    log-probability); every output is scored, and the reference metric only where a reference is."""
    model, _ = save_tiny_model_dir(tmp_path / "model")
    MTPHead.for_target(model).save_pretrained(tmp_path / "head")
    prompts = [{**p, "category": "summarization", "reference": ["w12 w13 w14"]} if p["question_id"] == 1 else p
               for p in PROMPTS]
    out = tmp_path / "report"
    r = runner.invoke(app, ["bench", "--target", str(tmp_path / "model"), "--head", str(tmp_path / "head"),
                            "--prompts", str(write_prompts(tmp_path / "p.jsonl", prompts)), "--methods", "k0,mtp,mtp-relaxed",
                            "--acceptance", "topm:3,0; typical:1,inf", "--max-new-tokens", "10", "-k", "3", "--dtype", "fp32",
                            "--threads", "1", "--no-progress", "--warmup", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    loose, limit = "mtp-relaxed:topm:3,0", "mtp-relaxed:typical:1,inf"
    assert res["methods"] == ["k0", "mtp", loose, limit]
    assert res["method_acceptance"] == {"k0": "exact", "mtp": "exact", loose: "topm:3,0", limit: "typical:1,inf"}
    overall = {s["method"]: s for s in res["summaries"] if s["category"] == "all"}
    assert overall[limit]["identical_k0"] == 4 and overall[limit]["changed_k0"] == 0 and overall[limit]["edit_k0"] == 0
    assert overall[limit]["quality"]["logprob"] == pytest.approx(overall["k0"]["quality"]["logprob"])
    assert overall[loose]["acceptance"] == "topm:3,0" and overall[loose]["mean_accepted"] > overall["mtp"]["mean_accepted"]
    for s in res["summaries"]:
        assert s["quality"]["n_logprob"] == s["prompts"] and s["quality"]["logprob"] < 0
        assert ("rougeL" in s["quality"]) == (s["category"] in ("all", "summarization")), s
    assert all(rec["acceptance"] == res["method_acceptance"][rec["method"]] for rec in res["records"])
    assert "## Quality" in (out / "results.md").read_text()
    assert "quality: rule" in r.stdout and "topm:3,0" in r.stdout and "ROUGE-L" in r.stdout
