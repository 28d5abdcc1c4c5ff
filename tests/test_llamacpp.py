"""The llama.cpp bench methods: greedy and prompt lookup on the target's GGUF file.

The first tests run against a stand-in for llama_cpp (what the methods ask of it); the last runs
llama.cpp itself on the embedded target's GGUF file and is skipped where llama-cpp-python is not
installed.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from mtpspec.errors import InputError
from mtpspec.measure import llamacpp
from mtpspec.measure.bench import BenchConfig


class FakeLlama:
    """What the methods use of llama_cpp.Llama: a greedy stream of [11, 12, 2, 13, 14], one eval
    (forward) per token, and `reset`."""

    made: list[FakeLlama] = []

    def __init__(self, **kw):
        self.kw = kw
        self.extra_buffers = sys.modules["llama_cpp.llama"].llama_cpp.llama_model_default_params().use_extra_bufts
        self.resets = 0
        FakeLlama.made.append(self)

    def reset(self):
        self.resets += 1

    def eval(self, tokens):
        pass

    def generate(self, tokens, **kw):
        self.generated = (tokens, kw)
        for t in [11, 12, 2, 13, 14]:
            self.eval([t])
            yield t


class FakeLookup:
    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.num_pred_tokens = num_pred_tokens


@pytest.fixture
def fake_llama_cpp(monkeypatch, tmp_path):
    low = types.SimpleNamespace(llama_model_default_params=lambda: types.SimpleNamespace(use_extra_bufts=True))
    wrapper = types.SimpleNamespace(llama_cpp=low)
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama, llama=wrapper))
    monkeypatch.setitem(sys.modules, "llama_cpp.llama", wrapper)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", types.SimpleNamespace(LlamaPromptLookupDecoding=FakeLookup))
    FakeLlama.made = []
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(llamacpp.GGUF_MAGIC + b"\0" * 16)
    return gguf, low


def test_greedy_decodes_the_prompt_ids_and_stops_at_eos_or_the_budget(fake_llama_cpp):
    gguf, low = fake_llama_cpp
    m = llamacpp.llamacpp_method(gguf, eos=[2], max_new_tokens=8, threads=2)
    out = m.run(torch.tensor([[5, 6, 7]]))
    llm = FakeLlama.made[0]
    assert m.name == "llamacpp" and out.tokens == [11, 12, 2] and out.target_forwards == 3 and out.ttft is not None
    assert llm.generated[0] == [5, 6, 7] and llm.generated[1]["temp"] == 0.0  # greedy, the same prompt ids
    assert llm.kw["model_path"] == str(gguf) and llm.kw["n_threads"] == llm.kw["n_threads_batch"] == 2
    assert llm.kw["draft_model"] is None
    assert llm.extra_buffers is False  # llama.cpp's AMX buffers off while the model loads,
    assert low.llama_model_default_params().use_extra_bufts is True  # and the defaults restored after
    assert m.run(torch.tensor([[5]])).target_forwards == 3  # counted per run, not accumulated
    assert llm.resets == 2  # every run starts from an empty cache: no prefix reused from the run before
    assert llamacpp.llamacpp_method(gguf, eos=[2], max_new_tokens=2, threads=1).run(torch.tensor([[5]])).tokens == [11, 12]


def test_lookup_drafts_k_tokens_with_llamas_prompt_lookup(fake_llama_cpp):
    gguf, _ = fake_llama_cpp
    m = llamacpp.lookup_method(gguf, eos=[2], max_new_tokens=8, threads=2, k=4)
    llm = FakeLlama.made[0]
    assert m.name == "llamacpp-lookup" and m.k == 4
    assert isinstance(llm.kw["draft_model"], FakeLookup) and llm.kw["draft_model"].num_pred_tokens == 4
    assert m.run(torch.tensor([[5, 6]])).tokens == [11, 12, 2]
    with pytest.raises(InputError, match="must be >= 1"):
        llamacpp.lookup_method(gguf, eos=[2], max_new_tokens=8, threads=2, k=0)


def test_the_llamacpp_methods_need_a_gguf_file(tmp_path):
    with pytest.raises(InputError, match="need the target's .gguf file"):
        llamacpp.llamacpp_method(tmp_path / "missing.gguf", eos=[2], max_new_tokens=4, threads=1)
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 a zip, not a GGUF file")
    with pytest.raises(InputError, match="is not a GGUF file"):
        llamacpp.lookup_method(tmp_path / "not.gguf", eos=[2], max_new_tokens=4, threads=1, k=2)
    with pytest.raises(InputError, match="give a .gguf target"):
        llamacpp.check_gguf(None)


def test_bench_method_notes_why_a_method_is_skipped(fake_llama_cpp, monkeypatch):
    gguf, _ = fake_llama_cpp
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "llama_cpp" else real(name, *a))
    m, note = llamacpp.bench_method("llamacpp-lookup", gguf, [2], 8, 2, lookup_k=3)
    assert note is None and m.name == "llamacpp-lookup" and m.k == 3
    m, note = llamacpp.bench_method("llamacpp-lookup", None, [2], 8, 2, lookup_k=3)
    assert m is None and "not a GGUF file" in note
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    m, note = llamacpp.bench_method("llamacpp", gguf, [2], 8, 2, lookup_k=3)
    assert m is None and "llama-cpp-python is not installed" in note
    with pytest.raises(InputError, match="Unknown llama.cpp method"):
        llamacpp.bench_method("llamacpp-tree", gguf, [2], 8, 2, lookup_k=3)


def test_bench_config_takes_the_lookup_k_and_needs_the_gguf_only_for_llamacpp():
    assert BenchConfig(methods=("k0", "llamacpp-lookup"), llamacpp_lookup_k=4).needs_gguf
    assert not BenchConfig(methods=("k0", "lookup")).needs_gguf
    with pytest.raises(InputError, match="--llamacpp-lookup-k must be >= 1"):
        BenchConfig(methods=("llamacpp-lookup",), llamacpp_lookup_k=0)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed "
                    "(pip install 'mtpspec[llamacpp]')")
@pytest.mark.slow  # llama.cpp on the real file, a 660-token prompt included (10 s)
def test_llama_cpp_runs_both_methods_on_the_embedded_gguf():
    from mtpspec.errors import MtpspecError
    from mtpspec.models import default_gguf_path

    try:
        gguf = default_gguf_path()
    except MtpspecError as e:
        pytest.skip(f"no embedded target: {e}")
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    # the last prompt is longer than llama.cpp's batch of 512 rows (lookup keeps every row's logits)
    prompts = ["The capital of France is", "one two three one two three one two", "red green blue " * 220]
    eos = [vocab.token_eos()]
    greedy = llamacpp.llamacpp_method(gguf, eos, max_new_tokens=6, threads=1)
    lookup = llamacpp.lookup_method(gguf, eos, max_new_tokens=6, threads=1, k=2)
    for text in prompts:
        ids = torch.tensor([vocab.tokenize(text.encode())])
        outs = {m.name: m.run(ids) for m in (greedy, lookup)}
        for name, out in outs.items():
            assert 1 <= len(out.tokens) <= 6 and vocab.detokenize(out.tokens).strip(), (name, text)
            assert out.seconds > 0 and out.ttft is not None
        # greedy: one forward per new token (the prefill yields the first); lookup: at most that
        assert outs["llamacpp"].target_forwards == len(outs["llamacpp"].tokens)
        assert 1 <= outs["llamacpp-lookup"].target_forwards <= len(outs["llamacpp-lookup"].tokens)
