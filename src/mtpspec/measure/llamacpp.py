"""llama.cpp in the bench: what a CPU user might run instead of mtpspec, on the same GGUF file.

Two methods, both through llama-cpp-python (`pip install 'mtpspec[llamacpp]'`), fed the same
prompt ids, greedy (temperature 0), with the bench's threads:

- `llamacpp`: llama.cpp's own greedy decoding, one token per forward.
- `llamacpp-lookup`: llama.cpp's prompt-lookup (n-gram) speculative decoding, its fastest
  drafting on a CPU without a draft model: `LlamaPromptLookupDecoding(num_pred_tokens=k)` as
  the `draft_model`, which drafts up to k tokens that followed the last n-gram (n <= 2) where it
  last occurred in the text so far, verified in one batched forward.

llama.cpp computes with the file's quantized weights (e.g. Q4_1) and activations, not the
dequantized values mtpspec and HF run, so its text differs from theirs. Its batched verify
forward is not row-invariant either, so `llamacpp-lookup` need not print what `llamacpp` prints:
the bench counts, per method, the outputs identical to `llamacpp` (`Summary.identical_llamacpp`).

Each run starts from an empty KV cache: llama-cpp-python would otherwise reuse the previous
prompt's cached prefix (the chat template's system turn), a prefill mtpspec and HF pay in full.
llama.cpp's C++ server has more n-gram modes (`--spec-type ngram-*`); the wheel builds no server
binary, so they are not offered here.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from .bench import Method, RunOutput  # bench.py imports this module where it builds its methods

METHODS = ("llamacpp", "llamacpp-lookup")
CONTEXT = 4096  # llama.cpp's context (KV cache slots): prompt + new tokens must fit
HINT = "pip install 'mtpspec[llamacpp]' (builds llama.cpp from source, ~10 minutes on 2 cores)"
GGUF_MAGIC = b"GGUF"


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def check_gguf(path: str | Path | None) -> Path:
    """`path` as a GGUF file llama.cpp can open, or an InputError that says why not."""
    if path is None:
        raise InputError("The llama.cpp methods run a GGUF file: give a .gguf target (--target FILE.gguf, or the "
                         "embedded default).")
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"GGUF file {p} not found; the llama.cpp methods need the target's .gguf file.")
    with p.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise InputError(f"{p} is not a GGUF file (no GGUF magic); the llama.cpp methods run GGUF files only.")
    return p


def bench_method(name: str, gguf: Path | None, eos: Sequence[int], max_new_tokens: int, threads: int,
                 lookup_k: int) -> tuple[Method | None, str | None]:
    """The bench method `name` (one of METHODS), or (None, a note on why it is skipped): not
    installed, or the target is not a GGUF file."""
    if name not in METHODS:
        raise InputError(f"Unknown llama.cpp method {name!r}; choose from {', '.join(METHODS)}.")
    if not installed():
        return None, f"{name}: skipped, llama-cpp-python is not installed: {HINT}."
    if gguf is None:
        return None, f"{name}: skipped, the target is not a GGUF file (llama.cpp runs GGUF files only)."
    if name == "llamacpp":
        return llamacpp_method(gguf, eos, max_new_tokens, threads), None
    return lookup_method(gguf, eos, max_new_tokens, threads, lookup_k), None


def llamacpp_method(gguf: str | Path, eos: Sequence[int], max_new_tokens: int, threads: int,
                    context: int = CONTEXT) -> Method:
    """llama.cpp's own greedy decoding of `gguf`, one token per forward."""
    llm = _open(check_gguf(gguf), threads, context, draft=None)
    return Method("llamacpp", _runner(llm, eos, max_new_tokens))


def lookup_method(gguf: str | Path, eos: Sequence[int], max_new_tokens: int, threads: int, k: int,
                  context: int = CONTEXT) -> Method:
    """llama.cpp's prompt-lookup speculative decoding of `gguf`, drafting up to k tokens a round."""
    if k < 1:
        raise InputError(f"--llamacpp-lookup-k must be >= 1, got {k}.")
    path = check_gguf(gguf)
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    llm = _open(path, threads, context, draft=LlamaPromptLookupDecoding(num_pred_tokens=k))
    return Method("llamacpp-lookup", _runner(llm, eos, max_new_tokens), k=k)


def _open(gguf: Path, threads: int, context: int, draft: Any) -> Any:
    """A llama_cpp.Llama on `gguf` that counts its forward passes (`forwards`)."""
    import llama_cpp

    class Counting(llama_cpp.Llama):  # type: ignore[misc, name-defined]
        """Counts `eval` calls: one per forward (a prefill, a decode step, or a verify of drafts)."""

        forwards = 0

        def eval(self, tokens: Sequence[int]) -> None:
            self.forwards += 1
            super().eval(tokens)

    # With a draft model llama-cpp-python keeps every prompt row's logits, in a buffer of
    # n_batch rows unless logits_all sizes it to the context: a prompt longer than n_batch (512)
    # then fails with a broadcast error, so the lookup method keeps all of them.
    return _no_extra_buffers(lambda: Counting(model_path=str(gguf), n_ctx=context, n_threads=threads,
                                              n_threads_batch=threads, verbose=False, logits_all=draft is not None,
                                              draft_model=draft))


def _runner(llm: Any, eos: Sequence[int], max_new_tokens: int) -> Callable[[torch.Tensor], RunOutput]:
    stop = {int(e) for e in eos}

    def run(ids: torch.Tensor) -> RunOutput:
        new: list[int] = []
        first = None
        llm.reset()  # an empty KV cache: the whole prompt is prefilled, as in every other method
        llm.forwards = 0
        t0 = time.perf_counter()
        for tok in llm.generate(ids[0].tolist(), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                reset=True):
            if first is None:
                first = time.perf_counter()
            new.append(int(tok))
            if tok in stop or len(new) >= max_new_tokens:
                break
        seconds = time.perf_counter() - t0
        return RunOutput(new, seconds, first - t0 if first is not None else None, llm.forwards, None)

    return run


def _no_extra_buffers(make: Callable[[], Any]) -> Any:
    """Build a llama_cpp.Llama with the model's `use_extra_bufts` off: on an AMX CPU llama.cpp
    0.3.36's AMX weight buffers crash (SIGSEGV in ggml_backend_amx_mul_mat) on the first
    decode, whatever it was built with. llama-cpp-python has no argument for it, so its
    default model parameters are patched for the one call."""
    import llama_cpp.llama as ll

    default = getattr(ll.llama_cpp, "llama_model_default_params", None)
    if default is None:
        return make()

    def params() -> Any:
        p = default()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    ll.llama_cpp.llama_model_default_params = params
    try:
        return make()
    finally:
        ll.llama_cpp.llama_model_default_params = default
