"""Training on a GPU (`mtpspec train --device`): the choice is checked before anything loads, a
run on CUDA takes the steps a CPU run takes, and what it saves is used on the CPU as it is.

The CUDA runs skip where PyTorch sees no GPU (CI, this project's CPUs); they are what a device
check runs (`reports/training/gpu/check.sh`)."""

from __future__ import annotations

import json
from copy import deepcopy

import pytest
import torch
from conftest import save_tiny_model_dir, tiny_model, write_tiny_data
from typer.testing import CliRunner

from mtpspec import MTPHead, SamplingConfig, Target
from mtpspec.cli import app
from mtpspec.config import TrainConfig
from mtpspec.core.draft import DraftInput
from mtpspec.errors import InputError
from mtpspec.training.activations import build_cache, load_cache
from mtpspec.training.devices import autocast, process_group_backend, resolve_device, to_device
from mtpspec.training.train import train, train_on_data

FAST = dict(batch_size=8, lr=3e-3, warmup_steps=2, eval_every=1000, save_every=1000, bf16=False, max_draft_tokens=3,
            min_steps=0, warmup_fraction=1.0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU here")


def _fake_gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_device_names_resolve_to_the_device_they_name(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CUDA ") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun, each rank its own GPU
    assert resolve_device("cuda") == torch.device("cuda", 1)
    _fake_gpus(monkeypatch, 0)
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("name, gpus, message", [
    ("cuda", 0, "needs a CUDA GPU.*--device cpu"),
    ("cuda:0", 0, "needs a CUDA GPU"),
    ("cuda:2", 2, "GPU 2 does not exist; PyTorch sees 2 \\(cuda:0 to cuda:1\\)"),
    ("tpu", 1, "not one of cpu, cuda, cuda:N or auto"),
    ("cuda:x", 1, "not one of"),
])
def test_a_device_that_is_not_there_is_a_clear_error(monkeypatch, name, gpus, message):
    _fake_gpus(monkeypatch, gpus)
    with pytest.raises(InputError, match=message):
        resolve_device(name)


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # a CUDA autocast made, not entered, on a CPU machine
def test_batches_autocast_and_process_group_follow_the_device():
    b = {"ids": torch.zeros(2, 3, dtype=torch.long)}
    assert to_device(b, torch.device("cpu")) is b
    assert autocast(torch.device("cpu"), True).device == "cpu"
    assert autocast(torch.device("cuda", 0), True).device == "cuda"
    assert (process_group_backend(torch.device("cpu")), process_group_backend(torch.device("cuda", 1))) == ("gloo", "nccl")
    # init_distributed's choice by device: tests/test_train.py::test_training_computes_on_the_cpu_even_where_cuda_is_available


def test_train_refuses_a_device_its_target_is_not_on(monkeypatch, tmp_path):
    """The head is made where its target is: asking for another device than the target's is an
    error that says how to move the target, not a device mismatch deep inside a step."""
    _fake_gpus(monkeypatch, 1)
    model = tiny_model("llama")
    with pytest.raises(InputError, match="got a target on cpu.*Target\\(model.to\\('cuda:0'\\)\\)"):
        train(Target(model), tmp_path / "no-cache", tmp_path / "run", TrainConfig(**FAST), device="cuda")


def test_the_cli_refuses_a_missing_gpu_before_reading_anything(tmp_path, monkeypatch):
    _fake_gpus(monkeypatch, 0)
    r = CliRunner().invoke(app, ["train", "--data", str(tmp_path / "no-such-data"), "--out", str(tmp_path / "run"),
                                 "--device", "cuda"])
    assert r.exit_code == 2 and "needs a CUDA GPU" in r.output and "no-such-data" not in r.output
    assert "Traceback" not in r.output and not (tmp_path / "run").exists()


# -- on a GPU -----------------------------------------------------------------------------------
@cuda
def test_the_cache_computed_on_a_gpu_holds_what_the_cpu_computes(tiny_run, tmp_path):
    model, root = tiny_run
    build_cache(Target(deepcopy(model).to("cuda")), root / "data", tmp_path / "act", (-1,), -1, teacher_topk=8,
                per_shard=10, progress=False)
    for a, b in zip(load_cache(root / "act"), load_cache(tmp_path / "act")):
        assert torch.equal(a.ids, b.ids) and a.prompt_len == b.prompt_len and b.hidden.device.type == "cpu"
        for name in ("hidden", "keys", "values"):  # both rounded to bf16 from fp32 sums in another order
            torch.testing.assert_close(getattr(b, name).float(), getattr(a, name).float(), atol=2e-2, rtol=2e-2)
        assert (a.top_ids[:, 0] == b.top_ids[:, 0]).float().mean() > 0.95  # the teacher's first choice


@cuda
def test_a_gpu_run_takes_the_steps_a_cpu_run_takes(tiny_run, tmp_path):
    """One epoch from the same cache and seed on each device: the same losses to fp32 rounding,
    and the head saved from the GPU loads beside the CPU target and drafts there."""
    model, root = tiny_run
    cfg = TrainConfig(epochs=1, **FAST)
    cpu = train(Target(model), root / "act", tmp_path / "cpu", cfg, progress=False)
    gpu_target = Target(deepcopy(model).to("cuda"))
    gpu = train(gpu_target, root / "act", tmp_path / "gpu", cfg, progress=False, device="cuda")
    assert gpu["step"] == cpu["step"] > 0

    def losses(d):
        return [json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path / "gpu") == pytest.approx(losses(tmp_path / "cpu"), rel=1e-2)
    assert gpu["final"]["accept_rounds"] == pytest.approx(cpu["final"]["accept_rounds"], abs=0.05)
    head = MTPHead.from_pretrained(tmp_path / "gpu" / "head", model)
    ref = MTPHead.from_pretrained(tmp_path / "cpu" / "head", model)
    for (n, p), (_, q) in zip(head.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(p, q, atol=1e-2, rtol=1e-2, msg=n)
    target = Target(model)
    cache = target.new_cache()
    ids = torch.randint(4, 97, (1, 9), generator=torch.Generator().manual_seed(0))
    step = target.forward(ids, cache, head.config.hidden_layers)
    d = head.propose(DraftInput(ids, step.hidden[:, -1], cache), 3, SamplingConfig(), None)
    assert d.tokens.numel() == 3


@cuda
def test_train_on_data_runs_on_a_gpu_end_to_end(tmp_path):
    """`mtpspec train --device cuda` with its cache, and `train_on_data` online on the GPU: both
    finish and save a head."""
    d = tmp_path / "model"
    model, _ = save_tiny_model_dir(d)
    write_tiny_data(model, tmp_path / "data")
    r = CliRunner().invoke(app, ["train", "--target", str(d), "--data", str(tmp_path / "data"), "--out",
                                 str(tmp_path / "run"), "--epochs", "1", "--min-steps", "0", "--batch-size", "8",
                                 "--max-draft-tokens", "2", "--no-bf16", "--device", "cuda", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "head" / "mtp_head.safetensors").is_file()
    cfg = TrainConfig(epochs=1, **{**FAST, "max_draft_tokens": 2})
    online = train_on_data([tmp_path / "data"], tmp_path / "online", cfg, target_name=str(d), cache_dtype="fp32",
                           online=True, progress=False, device="cuda")
    assert (tmp_path / "online" / "head" / "mtp_head.safetensors").is_file() and online["step"] > 0
