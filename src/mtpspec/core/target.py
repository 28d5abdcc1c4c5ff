"""The frozen target: one place that knows how to drive a Hugging Face causal LM.

Letters: B batch, T new tokens in this forward, S cached positions, D hidden size,
V vocabulary, Hk key/value heads, hd head dim.

The adapter never modifies the model: it sets eval mode and `requires_grad_(False)` once,
runs forwards against a `DynamicCache`, hands out read-only views of one layer's cached
keys/values and crops the cache after a rejection. Every family supported here exposes the
same pieces (`model.embed_tokens`, `model.norm`, `model.rotary_emb`, `lm_head`), so one
class covers them; another family would get its own adapter subclass here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ..errors import InputError, UnsupportedModelError

# model_type -> human name. All four run the same code path (pre-norm decoder, RoPE on the
# cached keys, GQA); verified by tests/test_decode.py on tiny random configs of each.
SUPPORTED = {"llama": "Llama / SmolLM2", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}


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
    logits: torch.Tensor  # (B, T_keep, V) float32
    hidden: torch.Tensor  # (B, T, F) the head's input features, F = D * len(hidden_layers)


class Target:
    """A frozen HF causal LM with the operations speculative decoding needs."""

    def __init__(self, model: PreTrainedModel):
        if isinstance(model, Target):  # pragma: no cover - defensive
            raise InputError("Target() got a Target; pass the Hugging Face model.")
        cfg = getattr(model, "config", None)
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED:
            arch = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
            raise UnsupportedModelError(
                f"mtpspec does not support the architecture {arch!r} (model_type={model_type!r}). "
                f"Supported: {', '.join(f'{v} ({k})' for k, v in SUPPORTED.items())}."
            )
        window = getattr(cfg, "sliding_window", None)
        if window is not None and (model_type == "mistral" or getattr(cfg, "use_sliding_window", False)):
            raise UnsupportedModelError(
                f"{model_type} with sliding_window={window} is not supported: a sliding-window cache "
                "cannot be rolled back exactly. Set config.sliding_window = None to use full attention."
            )
        for path in ("model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"):
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

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)

    @property
    def head_dim(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.hidden_size // self.num_heads)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

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
            embedding_fingerprint=embedding_fingerprint(self.embed.weight),
        )

    # -- running it ------------------------------------------------------------------------
    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        cache: DynamicCache,
        hidden_layers: tuple[int, ...] = (-1,),
        logits_to_keep: int = 0,
    ) -> TargetStep:
        """Run the new tokens against the cache (which grows by T). `logits_to_keep=n` computes
        logits for the last n positions only (0 = all): the LM head is a large matmul."""
        B, T = input_ids.shape
        out = self.model.model(input_ids=input_ids, cache=cache, use_cache=True, output_hidden_states=True)
        hs = out.hidden_states  # (num_layers + 1) x (B, T, D); [-1] is after the final norm
        hidden = hs[hidden_layers[0]] if len(hidden_layers) == 1 else torch.cat([hs[i] for i in hidden_layers], -1)
        keep = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return TargetStep(logits=self.lm_logits(keep).float(), hidden=hidden)  # (B, T_keep, V), (B, T, F)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, D) normed final hidden -> (B, T, V) through the target's LM head.

        One row goes through the LM head module itself, the very kernel HF `generate` uses.
        For a few rows (a verify pass) MKL's sgemm handles x @ W^T as one GEMV per row: measured
        on SmolLM2's 49,152 x 576 head, 1 thread, 11 ms for 1 row, 20 ms for 2, 34 ms for 3, while
        W @ x^T takes the GEMM path (5 ms, 9 ms). Same product, same values up to rounding."""
        B, T, D = h.shape
        if T == 1:
            return self.lm_head(h)
        w = self.lm_head.weight  # (V, D)
        out = torch.matmul(w, h.reshape(B * T, D).T).T.reshape(B, T, -1)  # (B, T, V)
        bias = getattr(self.lm_head, "bias", None)
        return out if bias is None else out + bias

    @staticmethod
    def cached_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read-only views of one layer's cached keys and values, (B, Hk, S, hd), RoPE applied."""
        lay = cache.layers[layer]
        return lay.keys, lay.values

    @staticmethod
    def rollback(cache: DynamicCache, n: int) -> None:
        """Drop the last n cached positions (the rejected drafts)."""
        if n > 0:
            cache.crop(-n)


def embedding_fingerprint(weight: torch.Tensor) -> str:
    """A short hash of the input embedding that survives a dtype change (fp32 <-> bf16):
    rows are sampled with a fixed stride and rounded to bf16 before hashing."""
    w = weight.detach()
    rows = w[:: max(1, w.shape[0] // 512)][:512].float().to(torch.bfloat16).cpu()
    return hashlib.sha256(rows.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
