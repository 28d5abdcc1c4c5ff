"""Tiny random targets built in-process (no downloads): the family factory every test file
builds its models with (`tiny_model` for FAMILIES, `quirky_model` for QUIRKY, `any_model` for
either), tiny saved model directories and data sets, and an oracle drafter."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
    GraniteConfig,
    GraniteForCausalLM,
    HeliumConfig,
    HeliumForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

from mtpspec import Draft, DraftInput, SamplingConfig
from mtpspec.core.tree import children

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


WINDOW = 8  # sliding window of the tiny interleaved-window configs; greedy tests cross it
GEMMA4 = {  # what both tiny Gemma 4 configs share
    "head_dim": 8, "global_head_dim": 16, "sliding_window": WINDOW, "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 2, "tie_word_embeddings": False,
    "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1_000_000.0}}}
# Families whose quirks go beyond FAMILIES' (test_target.py checks them against HF); each config
# turns its quirks on with values that differ from the defaults a plain path assumes.
QUIRKY = {
    # norms on sublayer outputs only, q/k norms over all heads before the split
    "olmo2": (Olmo2Config, Olmo2ForCausalLM, {}),
    # embedding/residual multipliers, attention_multiplier as the scale, logits divided; biases
    "granite": (GraniteConfig, GraniteForCausalLM, {
        "embedding_multiplier": 2.0, "residual_multiplier": 0.7, "attention_multiplier": 0.3,
        "logits_scaling": 3.0, "attention_bias": True, "mlp_bias": True}),
    # interleaved RoPE pairs, norms computed in fp32 (w.float() * x)
    "helium": (HeliumConfig, HeliumForCausalLM, {"head_dim": 8}),
    # layer 1 has no RoPE and slides
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM, {
        "no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": WINDOW}),
    # scaled embeddings, (1 + w) sandwich norms, both soft-caps, query_pre_attn_scalar, GELU-tanh,
    # sliding / full layers interleaved
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, {
        "head_dim": 8, "query_pre_attn_scalar": 12, "sliding_window": WINDOW, "num_hidden_layers": 4,
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
        "tie_word_embeddings": False, "initializer_range": 0.2}),  # tied, the scaled embedding repeats one token
    # as Gemma 2 (no soft-caps) plus per-head q/k norms and a RoPE table per layer type (local base
    # for sliding layers, linear scaling on the global one)
    "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM, {
        "head_dim": 8, "query_pre_attn_scalar": 12, "sliding_window": WINDOW, "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2, "tie_word_embeddings": False,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0}}}),
    # as Gemma 3 plus: wider heads and fewer key/value heads in the full-attention layers, whose
    # values are their key projection (k_eq_v); values normalized; a quarter of each full head
    # rotated (proportional RoPE); every layer's output scaled (layer_scalar, see quirky_model);
    # the final soft-cap; no query_pre_attn_scalar (scores unscaled)
    "gemma4_text": (Gemma4TextConfig, Gemma4ForCausalLM, {**GEMMA4, "attention_k_eq_v": True,
                                                          "num_global_key_value_heads": 1, "final_logit_softcapping": 3.0}),
    # the E-series (E2B / E4B): per-layer inputs, the last two layers reading the keys and values
    # of the last earlier layer of their type (KV sharing), their MLPs twice as wide
    "gemma4_text_e": (Gemma4TextConfig, Gemma4ForCausalLM, {
        **GEMMA4, "num_hidden_layers": 6, "layer_types": ["sliding_attention", "full_attention"] * 3,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 97, "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True}),
}


def quirky_model(family: str, seed: int = 0, **overrides):
    """A tiny random model of a QUIRKY family; every norm weight is perturbed too, so that a
    norm read as w instead of 1 + w, or applied in the wrong place, changes the output; so is
    Gemma 4's per-layer output scale (a buffer of ones until a checkpoint sets it)."""
    cfg_cls, model_cls, extra = QUIRKY[family]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{**COMMON, **extra, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    return model


def any_model(family: str):
    """A tiny model of any family in FAMILIES or QUIRKY."""
    return quirky_model(family) if family in QUIRKY else tiny_model(family)


KERNELS = ["bf16-amx", "bf16-avx512", "fp32"]


def kernel_dtype(param: str, amx_bits: int):
    """For a fixture over KERNELS: yields the dtype, the fused bf16 matmuls set to `amx_bits`
    (fused.AMX_*) for bf16-amx (skipped where there is no AMX) or to AVX-512 dot products for
    bf16-avx512, and set back to what the process started with afterwards."""
    from mtpspec.core import fused

    dt = torch.float32 if param == "fp32" else torch.bfloat16
    if (why := fused.reason(dt)) is not None:
        pytest.skip(f"no fused {dt} forward here: {why}")
    if dt == torch.float32:
        yield dt
        return
    so, start, _ = fused._library(dt)
    if param == "bf16-amx" and not start:
        pytest.skip("no AMX here")
    so.fused_init(amx_bits if param == "bf16-amx" else 0)
    try:
        yield dt
    finally:
        so.fused_init(start)


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
    """Proposes the known true continuation. With `inject=True` each round gets one wrong token
    at an offset drawn uniformly from 0..k (k = no error), so every acceptance length occurs."""

    hidden_layers = (-1,)

    def __init__(self, continuation: list[int], vocab: int, inject: bool = True, seed: int = 0):
        self.cont = continuation
        self.vocab = vocab
        self.inject = inject
        self.rng = random.Random(seed)

    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator) -> Draft:
        done = inp.tokens.shape[1]  # prompt + accepted = index of the first draft in `cont`
        out = [self.cont[done + i] if done + i < len(self.cont) else 0 for i in range(k)]
        if self.inject:
            at = self.rng.randrange(k + 1)
            if at < k:
                out[at] = (out[at] + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return Draft(tokens=torch.tensor(out, dtype=torch.long))

    def update(self, drafted: int, accepted: int) -> None:
        pass


def save_tiny_model_dir(path, family: str = "llama"):
    """A tiny model plus a word-level tokenizer with a chat template, saved as a local
    directory the CLI can load like any Hugging Face checkpoint (no network)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "<unk>", "<eos>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(4, 97)])}
    tk = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                  eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}w4 {{ m['content'] }} w5 {% endfor %}{% if add_generation_prompt %}w6{% endif %}"
    model = any_model(family)
    model.generation_config.eos_token_id = 3
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def write_tiny_data(model, data_dir, n: int = 24, prompt_len: int = 6, new: int = 40, seed: int = 0, batch: int = 1):
    """A data directory of the tiny target's own greedy continuations of random prompts, in
    the format `mtpspec data` writes. `batch` prompts are continued together (a few hundred
    samples in a second; rows may round differently from one at a time)."""
    from pathlib import Path

    from mtpspec.training.shards import save_manifest, write_shard

    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(0, n, batch):
        p = torch.randint(4, 97, (min(batch, n - i), prompt_len), generator=g)
        samples += [(row.tolist(), prompt_len) for row in hf_greedy(model, p, new, eos=[])]
    write_shard(d / "shard_00000.safetensors.xz", samples)
    save_manifest(d, {"target": {}, "settings": {"tiny": True}, "num_samples": n, "num_shards": 1,
                       "num_tokens": n * (prompt_len + new), "prompts_consumed": n, "prompt_hashes": []})
    return d


def chisquare_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """Pearson goodness-of-fit p-value of observed `counts` against exact cell `probs`.

    Cells whose expected count is below `min_expected` are pooled into one cell (topped up with
    the next-smallest cells until it reaches `min_expected`), so the chi-square approximation
    holds. A count in a cell of probability exactly 0 is an impossible outcome: p-value 0."""
    import numpy as np
    from scipy.stats import chisquare

    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs / probs.sum() * counts.sum()
    order = np.argsort(expected)
    exp_sorted, obs_sorted = expected[order], counts[order]
    m = int((exp_sorted < min_expected).sum())  # cells to pool, smallest first
    while 0 < m < len(exp_sorted) and exp_sorted[:m].sum() < min_expected:
        m += 1
    if m:
        exp_sorted = np.concatenate([[exp_sorted[:m].sum()], exp_sorted[m:]])
        obs_sorted = np.concatenate([[obs_sorted[:m].sum()], obs_sorted[m:]])
    assert len(exp_sorted) >= 2, "too few samples for a chi-square test"
    return float(chisquare(obs_sorted, exp_sorted).pvalue)


def tree_probs_without_renormalisation(tokens, parents, q, p):
    """A wrong `speculative_tree_probs`, for negative controls: after a sibling fails, the next
    is tested against max(0, r - q) left unnormalised, so later siblings pass too rarely (the
    target's own token is still drawn from the normalised residual)."""
    accept, next_dist = torch.zeros(len(parents)), p.clone()
    for row, kids in enumerate(children(parents)):
        r = p[row].clone()
        for c in kids:
            x = int(tokens[c - 1])
            accept[c - 1] = min(1.0, float(r[x] / q[c - 1, x]))
            r = (r - q[c - 1]).clamp_min(0)
        if r.sum() > 0:
            next_dist[row] = r / r.sum()
    return accept, next_dist


def assert_verify_passes_equal_one_row_passes(target, counts=(1, 2, 5, 9, 16, 17, 33, 40)) -> None:
    """After 30 cached tokens, a verify pass over R of max(counts) new tokens gives each row, bit
    for bit, the logits of decoding it alone, one row per forward (row invariance), for each R in
    `counts`."""
    n = max(counts)
    ids = torch.randint(4, 97, (1, 30), generator=torch.Generator().manual_seed(2))
    new = torch.randint(4, 97, (1, n), generator=torch.Generator().manual_seed(3))
    c = target.new_cache(30 + n + 10)
    target.forward(ids, c)
    alone = [target.forward(new[:, i:i + 1], c).logits[0, 0] for i in range(n)]
    for R in counts:
        c.length = 30
        together = target.forward(new[:, :R], c).logits[0]
        assert all(torch.equal(together[i], alone[i]) for i in range(R)), R


def assert_tree_rows_equal_their_paths(target) -> None:
    """Each row of a draft tree, verified in one pass, gets bit for bit the logits plain
    decoding of its path gets (it attends its ancestors where they lie in the cache; plain
    decoding sees them in depth order right after the prompt)."""
    from mtpspec.core.tree import TreeLayout

    ids = torch.randint(4, 97, (1, 20), generator=torch.Generator().manual_seed(4))
    parents = [-1, 0, 1, -1, 3, 0, 5]  # drafts under the root row: a spine 0-1-2, branches 3-4 and 5-6
    toks = torch.randint(4, 97, (1, len(parents) + 1), generator=torch.Generator().manual_seed(5))
    layout = TreeLayout.from_parents(parents)
    c = target.new_cache(64)
    target.forward(ids, c)
    tree = target.forward(toks, c, layout=layout)
    for r in range(len(parents) + 1):
        cp = target.new_cache(64)
        target.forward(ids, cp)
        out = target.forward(toks[:, layout.mask[r].nonzero()[:, 0]], cp)
        assert torch.equal(out.logits[0, -1], tree.logits[0, r]), r


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny Llama target, a data set it wrote (data/) and its activation cache (act/), once per
    test module: (model, root)."""
    from mtpspec import Target
    from mtpspec.training.activations import build_cache

    root = tmp_path_factory.mktemp("run")
    model = tiny_model("llama")
    write_tiny_data(model, root / "data")
    build_cache(Target(model), root / "data", root / "act", (-1,), -1, teacher_topk=8, per_shard=10, progress=False)
    return model, root
