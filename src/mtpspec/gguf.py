"""A GGUF target read once: its header walked straight from the file, its bytes mapped (copy on
write, nothing read until used), its config and tokenizer converted by transformers the first
time and cached, its matrices either kept as the file's quantized blocks (`QTensor`) or
dequantized once into a Hugging Face model.

Why not transformers' own GGUF load: it parses the file three times with gguf-py (~4 s each on
a 2-core EPYC, most of it building numpy views for the tokenizer's 98k strings), rebuilds its
tensor-name map ~400 times and converts the tokenizer again on every start. Here the header
costs one Python walk, and what only transformers can build (the config, the tokenizer, the
GGUF -> HF name map) is built once per file and kept under the cache dir, keyed by a hash of
the header it is built from (the tensor data plays no part in it).

The values are transformers' own: each tensor dequantized as gguf-py does it (the function
transformers calls; for Q4_0 / Q4_1 / Q8_0 a torch transcription of it, the same operations in
the same order, so equal bit for bit: tests check both), the q and k rows of a Llama-family
file put back in HF's order as transformers' `LlamaTensorProcessor` does, then cast to the
requested dtype tensor by tensor, in row chunks, so the peak stays near the model's own size.

Letters: O output rows, I inputs per row.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .core.native import cache_dir
from .core.quant import BLOCKS, QTensor
from .errors import InputError

WEIGHTS = ("dense", "gguf")  # load_target's choices: dense copies, or the file's blocks kept
FAST_ARCHS = ("llama",)  # architectures whose transformers load this module reproduces (checked on SmolLM2)
CACHE_FORMAT = "1"  # bump when what a cache folder holds changes
NAMES = "gguf-names.json"  # GGUF tensor name -> HF parameter name, written last in a cache folder
Q4_0, Q4_1, Q8_0 = 2, 3, 8  # the GGML types dequantized here in torch
CHUNK = 1 << 20  # elements dequantized at a time: bounds the fp32 temporaries (~4 MB each)

# Metadata value types (ggml's gguf.md): fixed-width scalars; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str  # as the file names it: blk.0.attn_q.weight
    qtype: int  # GGML type id
    shape: tuple[int, ...]  # torch order: (O, I) for a matrix
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True, eq=False)
class GGUFFile:
    """A GGUF file's header, and its bytes mapped copy-on-write."""

    path: Path
    metadata: dict[str, Any]  # string arrays (the tokenizer's vocabulary and merges) are left as None
    tensors: dict[str, TensorInfo]
    digest: str  # sha256 of the header bytes: all that the cached conversion depends on
    map: mmap.mmap
    buffer: np.ndarray  # (file bytes,) uint8 over `map`

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def raw(self, info: TensorInfo) -> np.ndarray:
        """A tensor's bytes as stored, one row per output: (O, row_bytes); a vector is one row."""
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        return self.buffer[info.offset:info.offset + info.nbytes].reshape(rows, -1)

    def release(self, info: TensorInfo) -> None:
        """Drop a tensor's pages from this process's memory (they were only read: the file still
        holds them), so a dense load does not keep the file resident beside its copy."""
        page = mmap.PAGESIZE
        start = -(-info.offset // page) * page
        end = (info.offset + info.nbytes) // page * page
        if end > start and hasattr(self.map, "madvise"):
            self.map.madvise(mmap.MADV_DONTNEED, start, end - start)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Map a GGUF file and read its header (metadata and tensor table; no tensor data)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise InputError(f"Cannot read the GGUF file {path}: {e}") from e
    if mapped[:4] != b"GGUF":
        raise InputError(f"{path} is not a GGUF file (it starts with {mapped[:4]!r}, not b'GGUF').")
    try:
        metadata, table, end = _read_header(mapped)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is truncated or corrupt: its header cannot be read ({e}).") from e
    alignment = int(metadata.get("general.alignment", 32))  # llama.cpp's default
    data_start = -(-end // alignment) * alignment
    tensors = {}
    for name, dims, qtype, offset in table:
        info = TensorInfo(name, qtype, tuple(reversed(dims)), data_start + offset, _nbytes(name, dims, qtype, path))
        if info.offset + info.nbytes > len(mapped):
            raise InputError(f"{path} is truncated: tensor {name} ends at byte {info.offset + info.nbytes}, "
                             f"the file has {len(mapped)}.")
        tensors[name] = info
    digest = hashlib.sha256(mapped[:end]).hexdigest()
    return GGUFFile(path, metadata, tensors, digest, mapped, np.frombuffer(mapped, dtype=np.uint8))


def _nbytes(name: str, dims: list[int], qtype: int, path: Path) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        n, b = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise InputError(f"{path}: tensor {name} is stored in GGML type {qtype}, which the installed gguf-py "
                         f"does not know; upgrade it (pip install -U gguf).") from None
    if dims[0] % n:
        raise InputError(f"{path} is corrupt: tensor {name}'s rows of {dims[0]} are not whole blocks of {n}.")
    return int(np.prod(dims, dtype=np.int64)) // n * b


def _read_header(buf: mmap.mmap) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """(metadata, [(name, ggml dims, type, data offset)], where the header ends), per gguf.md."""
    pos = 4

    def take(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > len(buf):
            raise ValueError("a string runs past the end of the file")
        pos += n
        return buf[pos - n:pos].decode("utf-8")

    def value(vtype: int) -> Any:
        nonlocal pos
        if vtype in _SCALARS:
            return take(_SCALARS[vtype])
        if vtype == _STRING:
            return string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown metadata value type {vtype}")
        itype, n = take("<I"), take("<Q")
        if itype == _STRING:  # the tokenizer's strings: skipped (transformers converts them, once)
            for _ in range(n):
                pos += 8 + take("<Q")
            if pos > len(buf):
                raise ValueError("a string array runs past the end of the file")
            return None
        if itype in _SCALARS:
            width = struct.calcsize(_SCALARS[itype])
            arr = np.frombuffer(buf, dtype=np.dtype(_SCALARS[itype]), count=n, offset=pos)
            pos += n * width
            return arr.tolist()
        return [value(itype) for _ in range(n)]

    version = take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; mtpspec reads versions 2 and 3")
    n_tensors, n_kv = take("<Q"), take("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        metadata[key] = value(take("<I"))
    table = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        table.append((name, dims, take("<I"), take("<Q")))
    return metadata, table, pos


def hf_row_order(rows: int, heads: int) -> np.ndarray:
    """(rows,) indices: row i of the HF matrix is row order[i] of the stored one.

    llama.cpp's converter (convert_hf_to_gguf.py, `LlamaModel.permute`) interleaves the two rotary
    halves of each head's q / k rows; transformers' `LlamaTensorProcessor._reverse_permute_weights`
    undoes it as reshape(heads, rows // heads // 2, 2).swapaxes(1, 2): the same map, on indices."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _row_order(gf: GGUFFile, name: str, rows: int) -> np.ndarray | None:
    """The row order transformers gives this tensor, or None where it keeps the file's."""
    arch = gf.architecture
    if arch != "llama" or not (".attn_q." in name or ".attn_k." in name):
        return None
    heads, kv = gf.metadata.get(f"{arch}.attention.head_count"), gf.metadata.get(f"{arch}.attention.head_count_kv")
    if heads is None or kv is None:  # transformers leaves the rows as stored when either is missing
        return None
    return hf_row_order(rows, heads if ".attn_q." in name else kv)


def converted(gf: GGUFFile) -> Path:
    """The cache folder with this file's config, tokenizer and tensor-name map: converted by
    transformers the first time (its own GGUF readers, a few seconds), reused afterwards."""
    import transformers

    folder = cache_dir() / "gguf" / f"{gf.digest[:32]}-transformers-{transformers.__version__}-{CACHE_FORMAT}"
    if (folder / NAMES).is_file():
        return folder
    from transformers import AutoConfig, AutoTokenizer

    src, kw = str(gf.path.parent), {"gguf_file": gf.path.name, "local_files_only": True}
    try:
        config = AutoConfig.from_pretrained(src, **kw)
        tokenizer = AutoTokenizer.from_pretrained(src, **kw)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        raise InputError(f"transformers cannot convert {gf.path}: {e}") from e
    names = _hf_names(gf, config)
    tmp = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the folder from other users of a shared cache
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / NAMES).write_text(json.dumps(names, indent=0))
        os.rename(tmp, folder)  # atomic; a process that got there first leaves its folder in place
    except OSError as e:
        if not (folder / NAMES).is_file():
            raise InputError(f"Cannot write {gf.path.name}'s converted config and tokenizer to {folder}: {e}. "
                             "Point MTPSPEC_CACHE at a writable folder.") from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _hf_names(gf: GGUFFile, config: Any) -> dict[str, str]:
    """{GGUF tensor name: HF parameter name}, found as transformers finds them: gguf-py's name map
    for the architecture, asked for each of the model's state-dict names. File tensors the model
    has no place for are left out (transformers skips them too)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers import AutoModelForCausalLM

    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == gf.architecture), None)
    if arch is None:
        raise InputError(f"{gf.path}: gguf-py has no tensor names for architecture {gf.architecture!r}.")
    with torch.device("meta"):  # names only: no memory, no init
        model = AutoModelForCausalLM.from_config(config)
    name_map = get_tensor_name_map(arch, config.num_hidden_layers)
    names = {}
    for hf in model.state_dict():
        base, _, suffix = hf.rpartition(".")
        stored = name_map.get_name(base)
        if stored is not None and f"{stored}.{suffix}" in gf.tensors:
            names[f"{stored}.{suffix}"] = hf
    return names


def _names(gf: GGUFFile) -> tuple[Path, dict[str, str]]:
    """(the cache folder, {GGUF name: HF name}) for a file of an architecture this module reads."""
    if gf.architecture not in FAST_ARCHS:
        raise InputError(f"{gf.path}: mtpspec reads the tensors of {', '.join(FAST_ARCHS)} GGUF files itself, "
                         f"not {gf.architecture!r} ones; load it with weights='dense'.")
    folder = converted(gf)
    try:
        return folder, json.loads((folder / NAMES).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"The cached conversion of {gf.path.name} in {folder} cannot be read ({e}); "
                         "delete that folder and it will be converted again.") from e


def _quantized(gf: GGUFFile, names: dict[str, str]) -> dict[str, QTensor]:
    out = {}
    for stored, hf in names.items():
        info = gf.tensors[stored]
        if info.qtype in BLOCKS and len(info.shape) == 2:
            raw = gf.raw(info)  # (O, row_bytes), a view of the map
            order = _row_order(gf, stored, info.shape[0])
            out[hf] = QTensor(info.qtype, (info.shape[0], info.shape[1]),
                              torch.from_numpy(raw if order is None else raw[order]))
    return out


def read_quantized(path: str | os.PathLike[str]) -> dict[str, QTensor]:
    """Every matrix the file stores in a type of `quant.BLOCKS`, keyed by HF parameter name, rows
    in HF's order: a view of the mapped file, or a row-permuted copy (q / k of Llama files).
    `lm_head.weight` appears only where the file has an `output.weight` of its own."""
    gf = open_gguf(path)
    return _quantized(gf, _names(gf)[1])


def dequantize(raw: np.ndarray, qtype: int) -> torch.Tensor:
    """(R, row_bytes) uint8 as stored -> (R, I) fp32: gguf-py's `dequantize`, the function
    transformers calls, transcribed to torch for Q4_0 / Q4_1 / Q8_0 with the same roundings in
    the same order (fp16 scales and small integers widened exactly, one multiply, then one add
    for Q4_1's minimum), so the values are equal bit for bit, in a fraction of the time."""
    R = raw.shape[0]
    b = torch.from_numpy(raw)
    if qtype == Q8_0:
        blocks = b.reshape(-1, 34)
        d = blocks[:, :2].contiguous().view(torch.float16).float()  # (blocks, 1)
        return blocks[:, 2:].contiguous().view(torch.int8).float().mul_(d).reshape(R, -1)
    if qtype in (Q4_0, Q4_1):
        blocks = b.reshape(-1, BLOCKS[qtype][1])
        d = blocks[:, :2].contiguous().view(torch.float16).float()
        qs = blocks[:, 2:] if qtype == Q4_0 else blocks[:, 4:]
        q = torch.empty(blocks.shape[0], 32, dtype=torch.uint8)  # low nibbles are elements 0..15
        torch.bitwise_and(qs, 0x0F, out=q[:, :16])
        torch.bitwise_right_shift(qs, 4, out=q[:, 16:])
        x = q.float()  # (blocks, 32); in place from here: the same roundings, fewer passes
        if qtype == Q4_0:
            return x.sub_(8).mul_(d).reshape(R, -1)  # q - 8 is exact in fp32, as in int8
        return x.mul_(d).add_(blocks[:, 2:4].contiguous().view(torch.float16).float()).reshape(R, -1)
    from gguf import GGMLQuantizationType
    from gguf import dequantize as gguf_dequantize

    try:
        out = gguf_dequantize(raw, GGMLQuantizationType(qtype))
    except NotImplementedError as e:
        raise InputError(f"gguf-py cannot dequantize GGML type {qtype}: {e}") from e
    return torch.from_numpy(np.asarray(out, dtype=np.float32)).reshape(R, -1)


def _dense_into(out: torch.Tensor, gf: GGUFFile, info: TensorInfo) -> None:
    """Fill `out` (info.shape) with one tensor as transformers loads it: dequantized, rows in HF's
    order, cast to out's dtype; a few rows at a time, so that only `CHUNK` fp32 values exist at once."""
    raw = gf.raw(info)
    order = _row_order(gf, info.name, raw.shape[0])
    if order is not None:
        raw = raw[order]
    rows = out.view(raw.shape[0], -1)
    step = max(1, CHUNK // info.shape[-1])
    for r in range(0, raw.shape[0], step):
        rows[r:r + step] = dequantize(raw[r:r + step], info.qtype)  # copy_ rounds fp32 -> dtype as .to does


def load(gf: GGUFFile, dtype: torch.dtype, weights: str = "dense") -> tuple[Any, Any, dict[str, QTensor]]:
    """(model, tokenizer, quantized): the model transformers' `from_pretrained(gguf_file=...)`
    builds, in `dtype`, and the file's tokenizer. weights='dense': every tensor dequantized once
    (quantized is empty). weights='gguf': the matrices of `read_quantized` are returned as
    `quantized` and their parameters left on the meta device (no memory; a dense forward that
    reaches one fails loudly); the rest (norms) are dense."""
    if weights not in WEIGHTS:
        raise InputError(f"Unknown weights {weights!r}; use one of {', '.join(WEIGHTS)}.")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights

    folder, names = _names(gf)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"The cached conversion of {gf.path.name} in {folder} cannot be read ({e}); "
                         "delete that folder and it will be converted again.") from e
    config.name_or_path = str(gf.path.parent)  # what from_pretrained(dir, gguf_file=...) records
    quantized = _quantized(gf, names) if weights == "gguf" else {}
    with no_init_weights():  # parameters are placeholders (never touched), buffers are computed
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # Every output is allocated before any temporary: allocated between them, the freed
    # temporaries stay in the heap for good (glibc cannot return memory below a live block),
    # ~60 MB more at the peak and after.
    state = {hf: torch.empty(gf.tensors[stored].shape, dtype=dtype, device="meta" if hf in quantized else "cpu")
             for stored, hf in names.items()}
    for stored, hf in names.items():
        if hf not in quantized:
            _dense_into(state[hf], gf, gf.tensors[stored])
            if weights == "dense":
                gf.release(gf.tensors[stored])
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()  # assign replaced the tied parameter: tie lm_head to the embedding again
    missing = sorted({n for n, _ in model.named_parameters()} - set(state))
    if missing:
        raise InputError(f"{gf.path} has no tensor for {', '.join(missing[:3])}"
                         f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}.")
    return model.eval(), tokenizer, quantized
