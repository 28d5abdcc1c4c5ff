"""Training a Gemma 4 assistant (`training/assistant.py`): the training unroll computes what
drafting computes, a short run on a tiny Gemma 4 target's own text raises acceptance, and the
folder it writes is what HF's assisted generation and mtpspec's loop both run: HF's greedy text
unchanged, the same drafts proposed from the same state, mtpspec's output plain decoding's."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy, quirky_model, write_tiny_data
from test_assistant import hf_candidates
from transformers import Gemma4AssistantForCausalLM

import mtpspec
from mtpspec import DraftInput, SamplingConfig, Target
from mtpspec.config import TrainConfig
from mtpspec.core.assistant import AssistantDrafter, load_assistant
from mtpspec.core.decode import prefill
from mtpspec.errors import InputError
from mtpspec.training.activations import build_cache
from mtpspec.training.assistant import AssistantObjective, new_assistant, unroll
from mtpspec.training.train import train

SMALL = dict(assistant_hidden=32, assistant_layers=2, bf16=False, max_draft_tokens=3)


@pytest.fixture(scope="module")
def gemma4_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("assistant-run")
    model = quirky_model("gemma4_text")
    write_tiny_data(model, root / "data", n=32, new=40)
    build_cache(Target(model), root / "data", root / "act", (-1,), -1, teacher_topk=8, per_shard=16, progress=False)
    return model, root


def test_the_training_unroll_drafts_what_the_drafter_drafts():
    """Row L - 1 of the unroll, fed the drafter's own drafts, reproduces them step by step: the
    same state, position, keys (sliding: the last W + 1) and logits as `AssistantDrafter`."""
    model = quirky_model("gemma4_text")
    target = Target(model)
    torch.manual_seed(0)
    assistant = new_assistant(target, TrainConfig(**SMALL)).eval()
    with torch.no_grad():  # larger random weights, so the drafts vary
        for p in assistant.parameters():
            p.mul_(10.0)
    drafter = AssistantDrafter(assistant, target)
    for T in (5, 20):  # inside and past the sliding window (8)
        ids = torch.randint(4, 97, (1, T), generator=torch.Generator().manual_seed(T))
        state, _ = prefill(target, ids, max_new_tokens=8)
        draft = drafter.propose(DraftInput(state.tokens, state.hidden, state.cache), 3, SamplingConfig(), None)
        seq = torch.cat([state.tokens, draft.tokens[None, :-1]], 1)  # x_0..x_L, then the drafts fed back
        with torch.no_grad():
            steps = unroll(assistant, target, seq, 3)
        L = state.cache.length
        got = [int(lg[0, L - 1].argmax()) for lg in steps]
        assert got == draft.tokens.tolist(), T
        assert len(set(got)) > 1 or T == 5  # not one repeated token


def test_a_short_run_raises_acceptance_and_hf_serves_the_result(gemma4_run, tmp_path):
    model, root = gemma4_run
    target = Target(model)
    cfg = TrainConfig(kind="gemma4-assistant", batch_size=8, lr=3e-3, epochs=1, min_steps=60, warmup_steps=5,
                      eval_every=1000, save_every=1000, holdout=0.25, **SMALL)
    before = AssistantObjective(new_assistant(target, cfg), target, cfg)
    from mtpspec.training.activations import load_cache
    from mtpspec.training.train import split

    _, held = split(load_cache(root / "act"), cfg)
    start = before.acceptance(held, 8)["accept_rounds"]
    r = train(target, root / "act", tmp_path, cfg, progress=False)
    assert r["final"]["accept_rounds"] > start + 0.25, (start, r["final"])  # measured: 1.01 -> 1.44
    saved = tmp_path / "assistant"
    assistant = Gemma4AssistantForCausalLM.from_pretrained(saved, local_files_only=True).eval()
    # HF runs the folder as it is: its assisted text is its greedy text, drafted by what mtpspec drafts
    ids = torch.randint(4, 97, (1, 6), generator=torch.Generator().manual_seed(100))
    assert torch.equal(model.generate(ids, assistant_model=assistant, max_new_tokens=30, do_sample=False),
                       hf_greedy(model, ids, 30))
    hf_tokens, _ = hf_candidates(model, assistant, ids, 3)
    state, _ = prefill(target, ids, max_new_tokens=8)
    drafter = load_assistant(saved, target)
    mine = drafter.propose(DraftInput(state.tokens, state.hidden, state.cache), 3, SamplingConfig(), None)
    assert mine.tokens.tolist() == hf_tokens.tolist()
    # and mtpspec's loop with it is plain decoding, with drafts accepted
    out = mtpspec.generate(model, drafter, ids, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
    plain = mtpspec.generate(model, None, ids, max_new_tokens=40, num_draft_tokens=0, eos_token_id=[])
    assert torch.equal(out.sequences, plain.sequences)
    assert out.stats.mean_accepted > 1.15  # measured: 1.34


def test_an_assistant_is_trained_for_gemma_4_only():
    from conftest import tiny_model

    with pytest.raises(InputError, match="for a Gemma 4 target"):
        new_assistant(Target(tiny_model("llama")), TrainConfig(kind="gemma4-assistant"))
    with pytest.raises(InputError, match="assistant_hidden and assistant_layers"):
        TrainConfig(kind="gemma4-assistant", assistant_layers=0)


def test_cli_trains_an_assistant_folder_that_generate_drafts_with(tmp_path):
    """`mtpspec train --kind gemma4-assistant` on a tiny Gemma 4 directory writes RUN/assistant,
    which `mtpspec generate --head` drafts with, output identical to plain decoding."""
    import json

    from conftest import save_tiny_model_dir
    from typer.testing import CliRunner

    from mtpspec.cli import app

    model, _ = save_tiny_model_dir(tmp_path / "target", "gemma4_text")
    write_tiny_data(model, tmp_path / "data", n=8, new=20)
    runner = CliRunner()
    r = runner.invoke(app, ["train", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "data"), "--out",
                            str(tmp_path / "run"), "--kind", "gemma4-assistant", "--assistant-hidden", "16",
                            "--assistant-layers", "2", "--min-steps", "3", "--batch-size", "4", "--holdout", "0.25"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 3
    r = runner.invoke(app, ["generate", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "run" / "assistant"),
                            "--prompt", "w7 w8", "-n", "12", "-k", "2", "--compare", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["plain"]["identical"]
