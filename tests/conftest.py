"""Tiny random targets built in-process (no downloads) and an oracle drafter."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from mtpspec import Draft, DraftInput, SamplingConfig

torch.set_num_threads(1)

COMMON = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    eos_token_id=3,
    bos_token_id=1,
    pad_token_id=0,
    tie_word_embeddings=True,
    # Large random weights: greedy continuations vary instead of repeating one token.
    initializer_range=0.5,
)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 8}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
}


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    cfg_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = cfg_cls(**{**COMMON, **extra, **overrides})
    return model_cls(cfg).eval()


@pytest.fixture
def llama():
    return tiny_model("llama")


def hf_greedy(model, ids: torch.Tensor, max_new_tokens: int, eos=None) -> torch.Tensor:
    kw = {} if eos is None else {"eos_token_id": eos}
    return model.generate(
        ids, max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(ids),
        pad_token_id=0, **kw,
    )


class OracleDrafter:
    """Proposes the known true continuation, with a wrong token injected at random offsets."""

    def __init__(self, continuation: list[int], vocab: int, error_rate: float, seed: int = 0):
        self.cont = continuation
        self.vocab = vocab
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self.offsets: list[int] = []

    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator) -> Draft:
        done = inp.tokens.shape[1]  # prompt + accepted; index of the first draft in `cont`
        out = []
        for i in range(k):
            pos = done + i
            tok = self.cont[pos] if pos < len(self.cont) else 0
            if self.rng.random() < self.error_rate:
                tok = (tok + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
                self.offsets.append(i)
            out.append(tok)
        return Draft(tokens=torch.tensor(out, dtype=torch.long))
