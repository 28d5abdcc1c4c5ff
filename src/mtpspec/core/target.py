"""The frozen target: one place that knows how to run a Hugging Face causal LM.

Letters: T new tokens in this forward, S cache slots (capacity), D hidden size, V vocabulary,
N decoder layers, H query heads, Hk key/value heads, hd head dim, F head input features.

The adapter reads the model's own modules and weights (never copies or changes them) and runs
its decoder stack itself, against a static KV cache indexed by slot (`cache.py`):

- a verify pass over k + 1 tokens writes k + 1 slots in place; rolling back is `KVCache.keep`;
  a draft tree arrives as its `tree.TreeLayout`, derived once from the parents;
- every row goes through the kernels `kernels.choose_plan` picked for this machine and dtype,
  whose results do not depend on how many rows run together, and attention always spans all
  S slots under a mask, so a row's reduction length never depends on the row count either;
  that is what makes a k + 1-token verify pass produce exactly the logits of k + 1
  one-token passes, in bf16 as in fp32;
- one call per op, no module dispatch, no mask objects, no hidden-state tuples.

Every family supported here is a decoder with the same module names (`model.embed_tokens`,
`model.layers[i].self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, `model.norm`,
`model.rotary_emb`, `lm_head`). Family quirks are read off the modules and the config, each
in one place below:

- where the norms sit (`_read_layer`): before each sublayer (Llama: `input_layernorm`,
  `post_attention_layernorm`), on each sublayer's output only (OLMo 2: `post_attention_layernorm`,
  `post_feedforward_layernorm`), or both (Gemma 2/3: four per layer); Llama-style RMSNorms run
  as one fused call, every other norm (OLMo 2's, Helium's, Gemma's 1 + weight) through the
  model's own module;
- q/k norms per head (Qwen3, Gemma 3) or over all heads before the split (OLMo 2); q/k/v and
  MLP biases; the attention scale the module itself uses (`self_attn.scaling`: Granite's
  attention_multiplier, Gemma's query_pre_attn_scalar);
- RoPE: one table, one per layer type (Gemma 3's local/global bases), none in some layers
  (SmolLM3's NoPE layers), rotating halves or interleaved pairs (Helium);
- scales and caps: the embedding scale (Gemma's sqrt(D) lives in its embedding module,
  Granite's embedding_multiplier here), Granite's residual_multiplier and logits_scaling,
  Gemma 2's attention and final logit soft-caps;
- sliding windows per layer (`_sliding_windows`);
- Gemma 4 (`gemma4.py`): head shapes per layer, values from the key projection or normalized,
  layers that read another layer's keys and values, per-layer inputs, per-layer output scales.

The head shares the embedding, final norm and LM head through `embed_tokens`, `final_norm`,
`finish_logits` and `rope`, so it sees exactly what the decoder stack sees; the fused forward
(`fused.py`) reads the weights through `weights()` (`weights.py`). A family that differs in more
than the above gets its own adapter here, or is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from ..errors import InputError, UnsupportedModelError
from . import fused, gemma4
from .cache import SLOT_ALIGN, KVCache
from .fused import SeqRows
from .kernels import KernelPlan, attention, choose_plan, linear
from .qmodules import QuantEmbedding, QuantLinear, dequantized_rows
from .rope import apply_rope, apply_rope_signed, signed_sin
from .tree import TreeLayout
from .weights import LayerWeights, Norm, Projection, TargetWeights

# model_type -> human name. All run the one code path in `Target.forward`, their quirks read
# off the modules (see the module docstring); each is checked against HF's forward and greedy
# `generate` by tests/test_target.py on tiny random configs.
SUPPORTED = {
    "llama": "Llama / SmolLM2", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "phi3": "Phi-3",
    "olmo2": "OLMo 2", "granite": "Granite", "helium": "Helium", "smollm3": "SmolLM3", "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)", "gemma4_text": "Gemma 4 (text)",
}
# Families whose RMSNorm is w * normalize(x).to(dtype), run as one fused call (`rms_norm`);
# the others' norms differ in where they cast or in (1 + w), and run through their own module.
_LLAMA_NORM = {"llama", "qwen2", "qwen3", "mistral", "phi3", "granite", "smollm3"}
# Families that rotate interleaved pairs (0, 1), (2, 3), ... instead of the two halves of a head.
_INTERLEAVED_ROPE = {"helium"}
# Multimodal checkpoints whose text decoder is a supported family: model_type -> the text one.
# Google publishes Gemma 3 and 4 this way (`...ForConditionalGeneration`); mtpspec runs the text.
_MULTIMODAL = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}


class TextOnly(nn.Module):
    """The text decoder of a multimodal checkpoint as a causal LM: its language model and LM head
    by reference (no copy, nothing changed on the model), its text config. Text in, text out:
    images and audio are not run."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model.model.language_model
        self.lm_head = model.lm_head
        self.config = model.config.get_text_config()
        self.multimodal = type(model).__name__


def text_only(model: nn.Module) -> nn.Module:
    """`model`, or its text decoder (`TextOnly`) where it is a multimodal checkpoint of a family
    whose text decoder mtpspec runs."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) in _MULTIMODAL and hasattr(getattr(model, "model", None), "language_model") \
            and getattr(cfg.get_text_config(), "model_type", None) == _MULTIMODAL[cfg.model_type]:  # type: ignore[union-attr]
        return TextOnly(model)  # type: ignore[arg-type]
    return model


@dataclass(frozen=True)
class TargetIdentity:
    """What a saved head records of the target it was trained for."""

    architecture: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    embedding_fingerprint: str


@dataclass
class TargetStep:
    logits: torch.Tensor  # (1, T_keep, V) float32
    hidden: torch.Tensor  # (1, T, F) the head's input features, F = D * len(hidden_layers)
    choice: torch.Tensor | None = None  # (T_keep,) each logits row's argmax, where the forward found it


NormFn = Callable[[torch.Tensor], torch.Tensor]
Weights = tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer as the torch path runs it: its weights (`LayerWeights`, the public
    description the fused forward reads too) and the callables that compute its norms and
    activation, all references (no copies)."""

    w: LayerWeights
    attn_in: NormFn | None  # before attention (None: OLMo 2 normalizes outputs only)
    attn_out: NormFn | None  # on attention's output, before the residual add (OLMo 2, Gemma)
    mlp_in: NormFn | None
    mlp_out: NormFn | None
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    act: nn.Module
    hd: int  # head dim of this layer's queries, keys and values
    hk: int  # key/value heads
    kv: str  # where its keys and values come from: gemma4.KV_KINDS ("own" everywhere but Gemma 4)
    source: int  # the layer whose cache entry it attends (itself unless kv == "shared")
    v_norm: nn.Module | None  # Gemma 4: a scale-free RMSNorm on the values
    scalar: torch.Tensor | None  # Gemma 4: the layer's output is multiplied by this (1,) buffer
    ple: gemma4.PerLayerInput | None  # Gemma 4's per-layer-input branch after the MLP
    # The parameters that now live in qkv / gate_up (q and gate lead them): if either is given
    # new data (`model.to(dtype)`, a weight swapped in), the layer is read again.
    watch: tuple[torch.Tensor, torch.Tensor]

    def stale(self) -> bool:
        if self.w.qkv.weight is None or self.w.gate_up.weight is None:
            return False  # a GGUF file's blocks (`QuantLinear`) are never given new data
        return self.watch[0].data_ptr() != self.w.qkv.weight.data_ptr() or self.watch[1].data_ptr() != self.w.gate_up.weight.data_ptr()


def _sliding_windows(cfg: object, model_type: str) -> list[int | None]:
    """Per layer, the sliding-window width (a key is visible iff its position > the query's
    minus the width), or None for full attention - as HF's masks define it. The cache keeps
    every position anyway (rolling back a draft must be exact); only the mask slides."""
    n = int(cfg.num_hidden_layers)  # type: ignore[attr-defined]
    window = getattr(cfg, "sliding_window", None)
    if window is None:
        return [None] * n
    if model_type == "mistral":  # Mistral slides in every layer when a window is set
        return [int(window)] * n
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * n
    return [int(window) if kind == "sliding_attention" else None for kind in types]


def _wb(lin: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return lin.weight, lin.bias


def _quantized(mods: list[nn.Module]) -> Projection | None:
    """Projections kept as a GGUF file's blocks (`QuantLinear`), stacked as parts with no dense
    copy; None when every one is a dense `nn.Linear`."""
    if not any(isinstance(m, QuantLinear) for m in mods):
        return None
    parts = tuple(m.qweight if isinstance(m, QuantLinear) else m.weight for m in mods)
    biases = [m.bias for m in mods]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else torch.zeros(int(p.shape[0]), dtype=next(x for x in biases if x is not None).dtype)
         for b, p in zip(biases, parts)])
    return Projection(None, bias, parts=parts)


def _linear(m: nn.Module) -> bool:
    return isinstance(m, (nn.Linear, QuantLinear))


def _back_to_back(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """parts stacked along dim 0 as one view, if they already lie back to back in one storage
    (Phi-3's fused projections, or weights an earlier `stack_in_place` re-homed); else None."""
    first = parts[0]
    off = first.storage_offset()
    for t in parts:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or t.storage_offset() != off):
            return None
        off += t.numel()
    rows = sum(int(t.shape[0]) for t in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def stack_in_place(params: list[torch.Tensor]) -> torch.Tensor:
    """One (sum of rows, ...) tensor holding `params` stacked along dim 0, with every param's
    data re-homed as a row view of it: the same values and the same memory as before (the old
    storages are freed), so one matmul can read what took several. A param keeps its identity;
    only where its values live changes. Params already back to back are viewed, not copied."""
    stacked = _back_to_back(params)
    if stacked is None:
        stacked = torch.cat([p.detach() for p in params])
        row = 0
        for p in params:
            p.data = stacked[row:row + p.shape[0]]
            row += p.shape[0]
    return stacked


def _stacked(pairs: list[Weights]) -> Weights:
    """(weights, biases) of projections that read the same input, as one stacked projection."""
    w = stack_in_place([p[0] for p in pairs])
    biases = [p[1] for p in pairs]
    if all(b is None for b in biases):
        return w, None
    if all(b is not None for b in biases):
        return w, stack_in_place(biases)  # type: ignore[arg-type]
    return w, torch.cat([b if b is not None else w.new_zeros(p[0].shape[0]) for b, p in zip(biases, pairs)])


def _float_or_none(x: object) -> float | None:
    return None if x is None else float(x)  # type: ignore[arg-type]


def _eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _norm_weights(norm: nn.Module | None) -> Norm | None:
    return None if norm is None else Norm(weight=norm.weight, eps=_eps(norm))


def _activation(act: nn.Module) -> str:
    """"silu" for SiLU as torch or transformers names its module, else the module's class name."""
    name = type(act).__name__
    return "silu" if name in ("SiLU", "SiLUActivation") else name


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """As Llama-style families compute it (x * rsqrt(mean(x^2) + eps) in fp32, cast back,
    then scale), in two calls instead of six: torch's fused norm takes a bf16/fp16 input in
    fp32 and rounds once on the way out, as HF's casts do; bit-identical on the CPU
    (tests/test_target.py)."""
    return w * F.rms_norm(x, (x.shape[-1],), eps=eps)


def _rope_parameters(cfg: object) -> list[dict]:
    """The config's RoPE parameters: one dict, or one per layer type (Gemma 3)."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    if not isinstance(rope, dict):
        return []
    nested = [v for v in rope.values() if isinstance(v, dict)]
    return nested if nested and len(nested) == len(rope) else [rope]


def _rope_tables_per_layer(cfg: object) -> list[str] | None:
    """Gemma 3 keeps one RoPE table per layer type (a local base for sliding layers, a global
    one for full attention; `rope_parameters` is keyed by the layer types): each layer's table,
    or None for a model with one table."""
    rope, types = getattr(cfg, "rope_parameters", None), list(getattr(cfg, "layer_types", None) or [])
    if isinstance(rope, dict) and types and all(isinstance(rope.get(t), dict) for t in types):
        return types
    return None


class Target:
    """A frozen HF causal LM with the operations speculative decoding needs."""

    def __init__(self, model: PreTrainedModel, plan: KernelPlan | None = None, engine: str = "auto"):
        """engine: "auto" runs the whole forward as one C call (`fused.py`) where the model,
        dtype and CPU allow it, else op by op through torch; "torch" always op by op."""
        if engine not in ("auto", "torch"):
            raise InputError(f"engine must be 'auto' or 'torch', not {engine!r}")
        if isinstance(model, Target):
            raise InputError("Target() got a Target; pass the Hugging Face model.")
        self.hf_model = model  # as given (`model` below: its text decoder, for a multimodal checkpoint)
        model = text_only(model)
        cfg = getattr(model, "config", None)
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED:
            arch = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
            raise UnsupportedModelError(
                f"mtpspec does not support the architecture {arch!r} (model_type={model_type!r}). "
                f"Supported: {', '.join(f'{v} ({k})' for k, v in SUPPORTED.items())}."
            )
        # Proportional RoPE (Gemma 4) rotates part of a head by a whole-head table (cos 1, sin 0
        # elsewhere), which the adapter applies as it is; other partial RoPE is refused.
        if any(float(r.get("partial_rotary_factor", 1.0)) != 1.0 and r.get("rope_type") != "proportional"
               for r in _rope_parameters(cfg)):
            raise UnsupportedModelError(f"{model_type} with partial rotary embeddings (partial_rotary_factor < 1) is not "
                                        "supported: the adapter rotates whole heads.")
        if getattr(cfg, "use_bidirectional_attention", None) in (True, "all"):  # Gemma 4's "vision": images only
            raise UnsupportedModelError(f"{model_type} with use_bidirectional_attention=True is not supported: tokens "
                                        "attend to later tokens, so the model cannot decode one token at a time.")
        for path in ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"):
            obj = model
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                raise UnsupportedModelError(f"{type(model).__name__} has no `{path}`; cannot attach a head.")
        model.eval()
        model.requires_grad_(False)
        self.model = model
        self.config = cfg
        self.model_type: str = model_type
        self.interleaved_rope = model_type in _INTERLEAVED_ROPE
        self._rope_tables = _rope_tables_per_layer(cfg)
        self.windows = _sliding_windows(cfg, model_type)
        if model_type == gemma4.MODEL_TYPE:
            gemma4.check(cfg)
        self._kv_sources = gemma4.kv_sources(cfg) if model_type == gemma4.MODEL_TYPE else list(range(self.num_layers))
        self._read_layers()
        self._rope_keys = sorted({L.w.rope for L in self._layers if L.w.rope is not None})  # tables a forward computes
        # Elementwise scales and caps (1.0 / None = absent): Granite's multipliers, Gemma 2's caps.
        self.embedding_multiplier = float(getattr(cfg, "embedding_multiplier", None) or 1.0)
        self.residual_multiplier = float(getattr(cfg, "residual_multiplier", None) or 1.0)
        self.logits_scaling = float(getattr(cfg, "logits_scaling", None) or 1.0)
        self.attn_softcap = _float_or_none(getattr(cfg, "attn_logit_softcapping", None))
        self.final_softcap = _float_or_none(getattr(cfg, "final_logit_softcapping", None))
        self._plans: dict[torch.dtype, KernelPlan] = {} if plan is None else {self.dtype: plan}
        self._engine_choice = engine
        self._fused: tuple[torch.dtype, fused.FusedForward | None] | None = None  # (for dtype, the fused forward)

    def _norm(self, module: nn.Module) -> NormFn:
        """A Llama-style RMSNorm as one fused call; any other norm through its own module."""
        if self.model_type in _LLAMA_NORM:
            return partial(rms_norm, w=module.weight, eps=_eps(module))
        return module

    def _read_layer(self, i: int, layer: nn.Module) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        name = type(self.model).__name__
        norms = {n: getattr(layer, n, None) for n in ("input_layernorm", "post_attention_layernorm",
                                                       "pre_feedforward_layernorm", "post_feedforward_layernorm")}
        if norms["pre_feedforward_layernorm"] is not None:  # Gemma 2/3: a norm before and after each sublayer
            attn_in, attn_out = norms["input_layernorm"], norms["post_attention_layernorm"]
            mlp_in, mlp_out = norms["pre_feedforward_layernorm"], norms["post_feedforward_layernorm"]
        elif norms["post_feedforward_layernorm"] is not None:  # OLMo 2: each sublayer's output only
            attn_in, attn_out, mlp_in, mlp_out = None, norms["post_attention_layernorm"], None, norms["post_feedforward_layernorm"]
            if norms["input_layernorm"] is not None or attn_out is None:
                raise UnsupportedModelError(f"{name}: a layer with post-sublayer norms and an input norm is not supported.")
        else:  # pre-norm: post_attention_layernorm is the MLP's input norm
            attn_in, attn_out, mlp_in, mlp_out = norms["input_layernorm"], None, norms["post_attention_layernorm"], None
            if attn_in is None or mlp_in is None:
                raise UnsupportedModelError(f"{name}: a decoder layer without input_layernorm and "
                                            "post_attention_layernorm is not supported.")
        kv = gemma4.kv_kind(a) if self.model_type == gemma4.MODEL_TYPE else "own"
        hd = int(getattr(a, "head_dim", None) or self.head_dim)
        if isinstance(getattr(a, "qkv_proj", None), nn.Linear):  # Phi-3: q, k, v fused; row views, no copy
            if a.qkv_proj.bias is not None:
                raise UnsupportedModelError(f"{name}: a fused qkv projection with a bias is not supported.")
            qkv = Projection(a.qkv_proj.weight)
        else:
            projs = {"own": ("q_proj", "k_proj", "v_proj"), "k": ("q_proj", "k_proj"), "shared": ("q_proj",)}[kv]
            for proj in projs:
                if not _linear(getattr(a, proj, None)):
                    raise UnsupportedModelError(f"{name}: attention has no linear `{proj}`.")
            mods = [getattr(a, proj) for proj in projs]
            qkv = _quantized(mods) or Projection(*_stacked([_wb(p) for p in mods]))  # zero copy after the first Target
        if isinstance(getattr(m, "gate_up_proj", None), nn.Linear):  # Phi-3: gate and up fused
            if m.gate_up_proj.bias is not None:
                raise UnsupportedModelError(f"{name}: a fused gate/up projection with a bias is not supported.")
            gate_up = Projection(m.gate_up_proj.weight)
            act = m.activation_fn
        else:
            mods = [m.gate_proj, m.up_proj]
            gate_up, act = _quantized(mods) or Projection(*_stacked([_wb(p) for p in mods])), m.act_fn
        o = _quantized([a.o_proj]) or Projection(*_wb(a.o_proj))
        down = _quantized([m.down_proj]) or Projection(*_wb(m.down_proj))
        source = self._kv_sources[i]
        # key/value heads as the module declares them (Gemma 4: per layer), else as the config does
        groups = getattr(a, "num_key_value_groups", None)
        hk = self.num_heads // int(groups) if groups else int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)
        if kv == "shared" and self._layers[source].hk != hk:
            raise UnsupportedModelError(f"{name}: layer {i} reads layer {source}'s keys and values, of another shape.")
        qkv_rows = (self.num_heads + {"own": 2, "k": 1, "shared": 0}[kv] * hk) * hd
        if qkv.out_features != qkv_rows or gate_up.out_features % 2 or self.num_heads % hk:
            raise UnsupportedModelError(f"{name}: q/k/v projections of {qkv.out_features} rows where the config "
                                        f"implies {qkv_rows}, or gate/up of an odd {gate_up.out_features}.")
        lead = getattr(a, "qkv_proj", None) or a.q_proj, getattr(m, "gate_up_proj", None) or m.gate_proj
        watch = tuple(p.blocks if isinstance(p, QuantLinear) else p.weight for p in lead)
        q_norm, k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        if (q_norm is None) != (k_norm is None) and kv != "shared":
            raise UnsupportedModelError(f"{name}: a q norm without a k norm (or the reverse) is not supported.")
        # OLMo 2 normalizes the whole projected q (H * hd) and k (Hk * hd); Qwen3 and Gemma 3 each head (hd)
        whole = q_norm is not None and q_norm.weight.shape[-1] == self.num_heads * hd != hd
        if self._rope_tables is not None:
            rope: str | None = self._rope_tables[i]
        else:
            rope = "" if getattr(a, "use_rope", True) else None  # SmolLM3: some layers have no RoPE
        w = LayerWeights(
            attn_norm=_norm_weights(attn_in), mlp_norm=_norm_weights(mlp_in),
            attn_out_norm=_norm_weights(attn_out), mlp_out_norm=_norm_weights(mlp_out),
            q_norm=_norm_weights(q_norm), k_norm=_norm_weights(k_norm), qk_norm_whole=whole,
            qkv=qkv, o=o, gate_up=gate_up, down=down, activation=_activation(act),
            scale=float(getattr(a, "scaling", None) or hd**-0.5), rope=rope, window=self.windows[i],
        )
        return _Layer(
            w=w,
            attn_in=None if attn_in is None else self._norm(attn_in),
            attn_out=None if attn_out is None else self._norm(attn_out),
            mlp_in=None if mlp_in is None else self._norm(mlp_in),
            mlp_out=None if mlp_out is None else self._norm(mlp_out),
            q_norm=q_norm, k_norm=k_norm, act=act, watch=watch, hd=hd, hk=hk, kv=kv, source=source,
            v_norm=getattr(a, "v_norm", None) if kv != "shared" else None, scalar=getattr(layer, "layer_scalar", None),
            ple=gemma4.per_layer_input(layer) if self.model_type == gemma4.MODEL_TYPE else None,
        )

    def _refresh(self) -> None:
        """Read the layers again if the model was cast or given new weights since."""
        if any(L.stale() for L in self._layers):
            self._read_layers()
            self._fused = None

    def _read_layers(self) -> None:
        """Every layer, in order (a KV-shared layer takes its source's shape, read before it)."""
        self._layers = []
        for i, layer in enumerate(self.model.model.layers):
            self._layers.append(self._read_layer(i, layer))

    def weights(self) -> TargetWeights:
        """The decoder stack's weights after the embedding, by reference (`weights.py`): what
        both forwards compute with."""
        self._refresh()
        return TargetWeights(layers=tuple(L.w for L in self._layers), final_norm=Norm(self.final_norm.weight, _eps(self.final_norm)),
                             lm_head=self.lm_projection, llama_norms=self.model_type in _LLAMA_NORM)

    @property
    def lm_projection(self) -> Projection:
        """The LM head as the forwards read it: dense, or a GGUF file's blocks (`QuantLinear`)."""
        return _quantized([self.lm_head]) or Projection(self.lm_head.weight, self.lm_head.bias)

    @property
    def quantized(self) -> bool:
        """Whether the target computes on a GGUF file's quantized blocks (`load_target(..., weights="gguf")`)."""
        return isinstance(self.lm_head, QuantLinear) or any(L.w.qkv.quantized or L.w.down.quantized for L in self._layers)

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(R,) ids -> (R, D) those rows of the LM head in the target's dtype (dense or dequantized)."""
        if isinstance(self.lm_head, QuantLinear):  # in C where it runs: 0.5 ms less a drafting round than gguf-py
            return dequantized_rows(self.lm_head.qweight, ids, self.dtype).to(ids.device)
        return self.lm_head.weight[ids]

    # -- the pieces the head shares by reference ------------------------------------------
    @property
    def embed(self) -> nn.Embedding:
        return self.model.model.embed_tokens

    @property
    def final_norm(self) -> nn.Module:
        return self.model.model.norm

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.lm_head

    @property
    def rotary_emb(self) -> nn.Module:
        return self.model.model.rotary_emb

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(..., T) ids -> (..., T, D) the decoder stack's input: the embedding module (Gemma's
        sqrt(D) scale lives inside it) times Granite's embedding_multiplier."""
        e = self.embed(ids)
        return e if self.embedding_multiplier == 1.0 else e * self.embedding_multiplier

    @property
    def finish_logits_is_identity(self) -> bool:
        """Whether `finish_logits` leaves the LM head's outputs as they are."""
        return self.logits_scaling == 1.0 and self.final_softcap is None

    def finish_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Raw LM-head outputs (..., V) -> the model's logits: divided by Granite's
        logits_scaling, soft-capped as Gemma 2 does (cap * tanh(z / cap)); elementwise."""
        if self.logits_scaling != 1.0:
            z = z / self.logits_scaling
        if self.final_softcap is not None:
            z = torch.tanh(z / self.final_softcap) * self.final_softcap
        return z

    def rope_table(self, positions: torch.Tensor, like: torch.Tensor, table: str = "") -> tuple[torch.Tensor, torch.Tensor]:
        """HF's rotary (cos, sin) at (B, T) positions, (B, T, hd) each, in `like`'s dtype, from
        rotary table `table` (a `LayerWeights.rope`: "" = the model's only one)."""
        if table:  # Gemma 3: one table per layer type
            return self.rotary_emb(like, positions, table)
        return self.rotary_emb(like, position_ids=positions)

    def rope(self, positions: torch.Tensor, like: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary (cos, sin), (B, T, hd) each, that layer `layer` applies to its keys at (B, T)
        positions (cos = 1, sin = 0 in a layer without RoPE); rotate with `apply_rope(x, cos, sin,
        target.interleaved_rope)`."""
        L = self._layers[self.layer_index(layer)]
        if L.w.rope is None:
            ones = like.new_ones(*positions.shape, L.hd)
            return ones, torch.zeros_like(ones)
        return self.rope_table(positions, like, L.w.rope)

    def kv_shape(self, layer: int) -> tuple[int, int]:
        """(Hk, hd): the key/value heads and head dim of layer `layer`'s cache entry (they differ
        between Gemma 4's sliding and full-attention layers)."""
        L = self._layers[self.layer_index(layer)]
        return L.hk, L.hd

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.out_features)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        """Layer 0's key/value heads: every layer's, except in Gemma 4 (see `kv_shape`)."""
        if getattr(self, "_layers", None):
            return self._layers[0].hk
        return int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)

    @property
    def head_dim(self) -> int:
        """Layer 0's head dim: every layer's, except in Gemma 4 (see `kv_shape`)."""
        if getattr(self, "_layers", None):
            return self._layers[0].hd
        return int(getattr(self.config, "head_dim", None) or self.hidden_size // self.num_heads)

    @property
    def max_positions(self) -> int | None:
        n = getattr(self.config, "max_position_embeddings", None)
        return int(n) if n else None

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.weight.dtype  # dense whatever the matrices are

    @property
    def dtype_name(self) -> str:
        """What the forward computes in, as `--dtype` takes it and as records key it (a data set's
        dtype, a head's recommended k): "float32", "bfloat16", or "q8" (bf16 with every quantized
        matmul's input rounded to 8 bits per 32 values: blocks packed by `quant.pack`)."""
        if self.quantized and any(getattr(m, "packed_for", None) == "q8" for m in self.lm_projection.matrices):
            return "q8"
        return str(self.dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        return self.final_norm.weight.device

    @property
    def plan(self) -> KernelPlan:
        """The kernels this machine runs row-invariantly and fastest (measured once, cached)."""
        if self.dtype not in self._plans:  # keyed by dtype: the model may be cast after wrapping
            L = self._layers[0].w
            uses: dict[tuple[int, int], int] = {}
            for p in (L.qkv, L.o, L.gate_up, L.down):
                shape = (p.out_features, int(p.matrices[0].shape[1]))
                uses[shape] = uses.get(shape, 0) + self.num_layers
            head_shape = (self.vocab_size, self.hidden_size)
            uses[head_shape] = uses.get(head_shape, 0) + 1
            widest = max(self._layers, key=lambda L: L.hd)  # Gemma 4: check the widest heads' attention
            heads = (self.num_heads, widest.hk, widest.hd)
            self._plans[self.dtype] = choose_plan(self.dtype, uses, heads, self.num_layers, softcap=self.attn_softcap,
                                                  on_cpu=self.device.type == "cpu")
        return self._plans[self.dtype]

    @property
    def engine(self) -> str:
        """"fused" (the whole forward as one C call, `fused.py`) or "torch" (op by op)."""
        return "torch" if self._fused_forward() is None else "fused"

    def engine_reason(self) -> str | None:
        """Why the fused forward does not run this target (None when it does)."""
        if self._engine_choice == "torch":
            return "engine='torch' was asked for"
        return fused.unsupported(self)

    def _fused_forward(self) -> fused.FusedForward | None:
        if self._fused is None or self._fused[0] != self.dtype or (self._fused[1] is not None and not self._fused[1].current()):
            ok = self._engine_choice == "auto" and fused.unsupported(self) is None
            if not ok and self.dtype_name == "q8":  # op by op it would compute bf16, not what it says
                raise InputError(f"--dtype q8 runs only in the fused forward, which does not run this target: "
                                 f"{self.engine_reason()}. Use --dtype bf16.")
            self._fused = (self.dtype, fused.FusedForward(self) if ok else None)
        return self._fused[1]

    def layer_index(self, i: int) -> int:
        """Resolve a possibly negative decoder-layer index."""
        j = i % self.num_layers if -self.num_layers <= i < self.num_layers else None
        if j is None:
            raise InputError(f"layer {i} is out of range for a target with {self.num_layers} layers.")
        return j

    def identity(self) -> TargetIdentity:
        return TargetIdentity(
            architecture=self.model_type,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            num_layers=self.num_layers,
            embedding_fingerprint=embedding_fingerprint(self.embed),
        )

    # -- running it ------------------------------------------------------------------------
    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty cache for `capacity` positions, rounded up to a multiple of SLOT_ALIGN
        (None: a growable cache for one-off forwards). Attention spans every slot, so two runs
        agree bit for bit only with equal capacities: `decode.prefill` derives it from the
        prompt length and max_new_tokens, never from the number of drafts."""
        S = -(-max(capacity or 0, 0) // SLOT_ALIGN) * SLOT_ALIGN
        shapes = [(L.hk, L.hd) for L in self._layers]
        if len(set(shapes)) > 1 or any(L.source != i for i, L in enumerate(self._layers)):  # Gemma 4
            stores = sorted({L.source for L in self._layers})
            return KVCache.layered([shapes[j] for j in stores], [stores.index(L.source) for L in self._layers], S,
                                   self.dtype, self.device, fixed=capacity is not None)
        shape = (self.num_layers, shapes[0][0], S, shapes[0][1])
        return KVCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                       torch.zeros(shape, dtype=self.dtype, device=self.device), fixed=capacity is not None)

    def check_length(self, length: int) -> None:
        """Refuse a text longer than the positions the model was trained for."""
        if self.max_positions and length > self.max_positions:
            raise InputError(f"{length} tokens exceed the target's {self.max_positions} positions "
                             "(max_position_embeddings); shorten the prompt or lower max_new_tokens.")

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        hidden_layers: tuple[int, ...] = (-1,),
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        layout: TreeLayout | None = None,
    ) -> TargetStep:
        """Run T new tokens against the cache; they are appended at slots length..length+T-1.

        layout: the draft tree the T rows form (`tree.TreeLayout`, built once per round by
        `decode.step`); None, or a chain's layout, is a chain: each row attends the rows before
        it. tree_mask (T, T) bool: the same tree given as its mask (`tree.tree_mask`) instead.
        All committed slots are always visible.
        positions (T,): their positions in the text (default: the layout's from the root at
        `cache.length`; a chain's length..length+T-1).
        logits_to_keep=n computes the LM head for the last n rows only (0 = all): the LM head is
        the largest matmul.
        hidden_layers: which features to return, indices into (embeddings, layer 1 input, ...,
        final normed output) as HF's `output_hidden_states` counts them (-1 = the final one)."""
        if tree_mask is not None:
            if layout is not None:
                raise InputError("forward takes a tree as layout or as tree_mask, not both.")
            layout = TreeLayout.from_mask(tree_mask)
        return self.forward_many([SeqRows(input_ids, cache, positions, layout, logits_to_keep)], hidden_layers)[0]

    @torch.no_grad()
    def forward_many(self, seqs: list[SeqRows], hidden_layers: tuple[int, ...] = (-1,)) -> list[TargetStep]:
        """`forward` for the rows of several sequences at once (continuous batching), each
        appended to its own cache: per sequence, bit for bit what `forward` returns for it alone.
        The fused forward runs them as one call (each weight read once for all rows); the torch
        engine runs them one after another. A `SeqRows` with positions None gets `forward`'s
        default positions."""
        if len({id(sq.cache) for sq in seqs}) != len(seqs):
            raise InputError("forward_many: each sequence needs its own cache.")
        resolved = [self._resolve(sq) for sq in seqs]
        self._refresh()
        if (run := self._fused_forward()) is not None:
            return [TargetStep(logits=lg, hidden=h, choice=c) for lg, h, c in run.many(resolved, hidden_layers)]
        return [self._torch_forward(sq.input_ids, sq.cache, hidden_layers, sq.positions, sq.layout, sq.logits_to_keep)
                for sq in resolved]

    @staticmethod
    def _resolve(sq: SeqRows) -> SeqRows:
        """One sequence's rows checked, with their positions (the layout's from the root at the
        cache's length; a chain's length..length+T-1) and room in its cache; a tree that is a
        chain verifies as one (layout None)."""
        B, T = sq.input_ids.shape
        if B != 1:
            raise InputError(f"mtpspec decodes one sequence at a time; got a batch of {B}.")
        if sq.layout is not None and sq.layout.rows != T:
            raise InputError(f"the tree layout has {sq.layout.rows} rows, but {T} tokens were given.")
        start = sq.cache.length
        positions = sq.positions
        if positions is None:
            positions = torch.arange(start, start + T) if sq.layout is None else sq.layout.positions(start)
        sq.cache.reserve(start + T)
        layout = None if sq.layout is not None and sq.layout.is_chain else sq.layout
        return dataclasses.replace(sq, positions=positions.to(sq.input_ids.device), layout=layout)

    def _torch_forward(self, input_ids: torch.Tensor, cache: KVCache, hidden_layers: tuple[int, ...],
                       positions: torch.Tensor, layout: TreeLayout | None, logits_to_keep: int) -> TargetStep:
        """`forward` op by op; layout None = a chain."""
        T = input_ids.shape[1]
        start, S, dev = cache.length, cache.capacity, input_ids.device
        slots = torch.arange(S, device=dev)
        tree = layout is not None
        if layout is None:  # (T, S): every committed slot, then the new ones causally
            mask = slots[None, :] <= start + torch.arange(T, device=dev)[:, None]
        else:
            # A tree row must see exactly the slots, order and shapes it would see if its path
            # had been decoded one token at a time: its ancestors and itself right after the
            # committed slots, in depth order. (Shared slots would put an ancestor elsewhere
            # among masked slots, and attention sums in a different order.) The leading rows
            # whose ancestors are exactly the rows before them (the spine, when the draft is
            # ordered spine first: `tree.spine_first`) already have that layout in the cache
            # itself, and attend it directly as a chain verify does; every later row reads its
            # own copy of it.
            C = layout.spine  # leading rows that attend the cache as it is
            # All rows then run as ONE attention call over P planes of W query rows each. The
            # rows are cut into chains (each row continues its parent's chain if it is the first
            # to do so): plane 0 is the spine on the cache layout itself, every other chain gets
            # its own plane, a copy of the cache laid out as its last row would see it, which
            # every earlier row of that chain sees a prefix of. A chain shorter than W repeats
            # its last row (each row's result is independent of the others, so the repeats only
            # pad the shape). One call for all rows, and one copy per branch rather than per
            # row, keep a branch's price near its copy: the per-call overhead is most of an
            # attention's cost at these sizes.
            chains = [list(range(C))]  # the spine: the cache as it is, which no later row continues
            tail: dict[int, int] = {}  # last row of a gathered chain -> its chain
            for r in range(C, T):
                j = tail.pop(layout.parents[r - 1] + 1, None)  # the chain ending at r's parent row
                if j is None:
                    j = len(chains)
                    chains.append([])
                chains[j].append(r)
                tail[r] = j
            P, W = len(chains), max(len(ch) for ch in chains)
            # Planes 1..P-1 (the cache's own, `KVCache.planes`) already hold the committed slots;
            # each layer copies in only its branch's new slots: plane j's slot start + d reads
            # cache slot start + path_j[d] (path_j: the new rows its last row sees, in order).
            kplanes, vplanes = cache.planes(P, start)  # (N, P' >= P, Hk, S, hd) each; [i] per layer if layered
            paths = [layout.anc[ch[-1], : int(layout.nanc[ch[-1]])].tolist() for ch in chains[1:]]
            copies = {}  # Hk -> (dst, src) rows of (P' * Hk * S, hd)
            for nkv in {L.hk for L in self._layers}:
                dst, src = [], []
                for j, path in enumerate(paths, 1):
                    dst += [(j * nkv + h) * S + start + d for h in range(nkv) for d in range(len(path))]
                    src += [h * S + start + r for h in range(nkv) for r in path]
                copies[nkv] = torch.tensor(dst, device=dev), torch.tensor(src, device=dev)
            qrows = torch.tensor([ch[min(w, len(ch) - 1)] for ch in chains for w in range(W)], device=dev)  # (P * W,)
            where = {r: j * W + w for j, ch in enumerate(chains) for w, r in enumerate(ch)}
            out_rows = torch.tensor([where[r] for r in range(T)], device=dev)  # (T,): row r's place in (P * W)
            mask = slots[None, :] < start + layout.nanc.to(dev, torch.long)[:, None]  # (T, S)
        # In the attention layout a key's slot is its position (chain: by construction; tree:
        # the gathered layout), so a sliding window is one more mask condition.
        masks = {w: mask if w is None else mask & (slots[None, :] > positions[:, None] - w) for w in set(self.windows)}
        if tree:
            plane_masks = {w: m[qrows].view(P, W, S) for w, m in masks.items()}  # (P, W, S)
        plan = self.plan
        H = self.num_heads
        rm, cap = self.residual_multiplier, self.attn_softcap
        lin = partial(_plain_linear, kind=plan.linear)

        x = self.embed_tokens(input_ids)[0]  # (T, D)
        per_layer = gemma4.per_layer_inputs(self.model, input_ids, x, lin)  # (T, N, P) or None
        ropes = {}  # rotary table -> (cos, sin), (1, 1, T, hd) each; sin signed unless interleaved
        for key in self._rope_keys:
            cos, sin = self.rope_table(positions[None], x, key)  # (1, T, hd) each
            ropes[key] = cos[:, None], (sin if self.interleaved_rope else signed_sin(sin))[:, None]
        n_feat = self.num_layers + 1
        want = {i % n_feat for i in hidden_layers}
        feats: dict[int, torch.Tensor] = {}
        for i, L in enumerate(self._layers):
            w = L.w
            if i in want:
                feats[i] = x
            # attention
            h = x if L.attn_in is None else L.attn_in(x)  # (T, D)
            Hk, hd = L.hk, L.hd
            qkv = linear(h, w.qkv.dense(self.dtype), w.qkv.bias, plan.linear)  # (T, H * hd [+ Hk * hd [+ Hk * hd]])
            if L.kv == "shared":  # Gemma 4: keys and values are layer L.source's, already cached
                q, k, v = qkv, qkv[:, :0], None  # (T, H * hd), no keys
            elif L.kv == "k":  # Gemma 4 k_eq_v: the values are the key projection itself
                q, k = qkv.split([H * hd, Hk * hd], -1)
                v = k.view(T, Hk, hd)
            else:
                q, k, v = qkv.split([H * hd, Hk * hd, Hk * hd], -1)  # (T, H * hd), (T, Hk * hd) x 2
                v = v.view(T, Hk, hd)
            if w.qk_norm_whole:
                q, k = L.q_norm(q), L.k_norm(k)  # type: ignore[misc]
            q, k = q.view(T, H, hd), k.view(T, -1, hd)  # (T, H, hd), (T, Hk or 0, hd)
            if L.q_norm is not None and not w.qk_norm_whole:
                q = L.q_norm(q)
                if v is not None:
                    k = L.k_norm(k)  # type: ignore[misc]
            if L.v_norm is not None and v is not None:
                v = L.v_norm(v)
            qk = torch.cat([q, k], 1).transpose(0, 1)[None]  # (1, H + Hk, T, hd): one RoPE for both
            if w.rope is not None:
                cos, sin = ropes[w.rope]
                qk = apply_rope(qk, cos, sin, True) if self.interleaved_rope else apply_rope_signed(qk, cos, sin)
            q, k = qk[:, :H], qk[:, H:]  # (1, H, T, hd), (1, Hk, T, hd)
            if v is not None:
                cache.keys[i][:, start:start + T] = k[0]
                cache.values[i][:, start:start + T] = v.transpose(0, 1)
            if not tree:
                a = attention(q, cache.keys[i][None], cache.values[i][None], masks[w.window], w.scale, plan.attention, cap)[0]  # (H, T, hd)
            else:  # one call over the P planes (see above)
                kp, vp = kplanes[i][:P], vplanes[i][:P]  # (P, Hk, S, hd) each, contiguous
                if v is not None:  # a KV-shared layer reads planes its source already laid out
                    dst_t, src_t = copies[Hk]
                    for t in (kplanes[i], vplanes[i]):
                        flat = t.view(-1, hd)  # (P' * Hk * S, hd), planes are contiguous
                        flat.index_copy_(0, dst_t, flat.index_select(0, src_t))
                qp = q[0].index_select(1, qrows).view(H, P, W, hd).transpose(0, 1).contiguous()  # (P, H, W, hd)
                ap = attention(qp, kp, vp, plane_masks[w.window], w.scale, plan.attention, cap)  # (P, H, W, hd)
                a = ap.transpose(0, 1).reshape(H, P * W, hd).index_select(1, out_rows)  # (H, T, hd)
            out = linear(a.transpose(0, 1).reshape(T, H * hd), w.o.dense(self.dtype), w.o.bias, plan.linear)  # (T, D)
            if L.attn_out is not None:
                out = L.attn_out(out)
            x = x + (out if rm == 1.0 else out * rm)
            # MLP
            h = x if L.mlp_in is None else L.mlp_in(x)
            gate, up = linear(h, w.gate_up.dense(self.dtype), w.gate_up.bias, plan.linear).chunk(2, -1)  # (T, M) each
            g = L.act(gate) * up
            out = linear(g, w.down.dense(self.dtype), w.down.bias, plan.linear)  # (T, D)
            if L.mlp_out is not None:
                out = L.mlp_out(out)
            x = x + (out if rm == 1.0 else out * rm)
            if L.ple is not None:
                x = gemma4.apply_per_layer_input(x, L.ple, per_layer[:, i], lin)  # type: ignore[index]
            if L.scalar is not None:
                x = x * L.scalar
        x = self.final_norm(x)  # (T, D)
        feats[self.num_layers] = x
        cache.length = start + T
        hidden = torch.cat([feats[i % n_feat] for i in hidden_layers], -1)[None]  # (1, T, F)
        keep = x[-logits_to_keep:] if logits_to_keep else x
        return TargetStep(logits=self.lm_logits(keep)[None].float(), hidden=hidden)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(R, D) normed final hidden -> (R, V) the model's logits: the target's LM head, with
        the same row-invariant kernel as every other matmul, then `finish_logits`."""
        lm = self.lm_projection
        return self.finish_logits(linear(h, lm.dense(self.dtype), lm.bias, self.plan.linear))


def _plain_linear(x: torch.Tensor, w: torch.Tensor, kind: str) -> torch.Tensor:
    """x @ w.T by the plan's row-invariant kernel (no bias)."""
    return linear(x, w, None, kind)


def embedding_fingerprint(embed: nn.Module | torch.Tensor) -> str:
    """A short hash of the input embedding (a module or its weight) that survives a dtype
    change (fp32 <-> bf16) and quantized storage: rows are sampled with a fixed stride and
    rounded to bf16 before hashing (a GGUF file's blocks: those rows dequantized, the values a
    dense load holds)."""
    if isinstance(embed, QuantEmbedding):
        V = embed.num_embeddings
        rows = embed.qweight.dequantize(torch.arange(0, V, max(1, V // 512))[:512]).to(torch.bfloat16)
    else:
        w = (embed.weight if isinstance(embed, nn.Module) else embed).detach()
        rows = w[:: max(1, w.shape[0] // 512)][:512].float().to(torch.bfloat16).cpu()
    return hashlib.sha256(rows.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
