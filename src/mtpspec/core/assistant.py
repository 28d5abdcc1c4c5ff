"""Google's Gemma 4 "assistant" drafter (`Gemma4AssistantForCausalLM`) in mtpspec's loop.

Letters: L committed positions (the target's cache), D the target's hidden size, Hk_i / hd_i
the key/value heads and head dim of target layer i, W the assistant's sliding window, k drafts,
V vocabulary.

The assistant is a small Gemma 4 decoder with no keys, values or cache of its own: every layer
cross-attends to the target's keys and values, those of the target's last layer of the same
type that computes them (a "store" layer, `Gemma4TextConfig.kv_sharing_modes`). One draft step,
as HF's `SinglePositionMultiTokenCandidateGenerator` runs it:

    x  = [target embedding of the last token ; the step's state]      (1, 1, 2D)
    out = assistant(x, position id L, the store layers' committed K/V)
    token = argmax(out.logits);  next state = out.last_hidden_state    (post_projection, (1, 1, D))

The first state is the target's final normed hidden state at L - 1; every step keeps the query
at position L (the token being drafted from, not yet in the cache) and sees the same keys, so k
drafts cost k small forwards and no cache writes anywhere.

Which keys a step sees, read off HF (tests/test_assistant.py checks it):
- full-attention layers: all L committed positions;
- sliding layers: the last W + 1 committed positions (L - W - 1 .. L - 1). HF's assistant
  builds a *bidirectional* sliding mask, |q_idx - kv_idx| <= W (inclusive), for its one query at
  index 0, then flips it along the keys, so the visible keys are the last W + 1 it was given.
  (The target's own sliding layers see W keys at position L, itself included, so W - 1
  committed ones: the assistant reads two more.) We pass exactly those W + 1 slots, zero copy,
  so the mask is all-visible and attention spans W + 1 keys, not L.
HF's assisted loop hands the assistant more than the committed keys after a round that rejects
drafts: its sliding entries are the K/V its verify pass returned (the W - 1 slots cached before
the round plus every verified row, rejected drafts included) and its full-attention entries are cut to the text's
length, one slot past the committed ones (a rejected draft's). Those keys belong to tokens the
text does not contain; here a round always sees the committed L only, as HF's does right after
prefill and after a round that accepts every draft.

Sampling draws each draft from q = `probs_from_logits` of the assistant's logits (the target's
temperature, top-k, top-p) and returns q, so speculative sampling stays exact. (HF's loop
drafts by argmax even when sampling, and verifies against softmax(logits) as if drawn from it.)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..config import SamplingConfig
from ..errors import InputError
from .cache import KVCache
from .draft import Draft, DraftInput
from .gemma4 import store_layers
from .sampling import probs_from_logits, sample
from .target import Target

MODEL_TYPE = "gemma4_assistant"
TARGET_TYPE = "gemma4_text"


def is_assistant_dir(path: str | Path) -> bool:
    """Whether `path` is a saved Gemma 4 assistant: a config.json with model_type "gemma4_assistant"."""
    cfg = Path(path) / "config.json"
    try:
        return json.loads(cfg.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def check_pair(assistant_cfg: object, target: Target) -> dict[str, int]:
    """Refuse an assistant that cannot draft for `target`, with the reason; returns
    `store_layers` of the target."""
    if getattr(assistant_cfg, "model_type", None) != MODEL_TYPE:
        raise InputError(f"Expected a Gemma 4 assistant (model_type {MODEL_TYPE!r}), got "
                         f"{getattr(assistant_cfg, 'model_type', None)!r}.")
    if target.model_type != TARGET_TYPE:
        raise InputError(f"A Gemma 4 assistant drafts for a Gemma 4 text model (model_type {TARGET_TYPE!r}); the "
                         f"target is {target.model_type!r}. Load the Gemma 4 checkpoint the assistant was made for.")
    backbone = int(assistant_cfg.backbone_hidden_size)  # type: ignore[attr-defined]
    if backbone != target.hidden_size:
        raise InputError(f"The assistant was made for a target of hidden size {backbone}, but this target's is "
                         f"{target.hidden_size}: load the assistant of this Gemma 4 size (e.g. gemma-4-e2b-it-assistant "
                         "for gemma-4-e2b-it).")
    text = assistant_cfg.get_text_config()  # type: ignore[attr-defined]
    if int(text.vocab_size) != target.vocab_size:
        raise InputError(f"The assistant's vocabulary ({text.vocab_size} tokens) differs from the target's "
                         f"({target.vocab_size}): they must share Gemma 4's tokenizer.")
    stores = store_layers(target.config)
    for i, kind in enumerate(text.layer_types):
        if kind not in stores:
            raise InputError(f"Assistant layer {i} attends {kind} keys, but the target has no {kind} layer.")
        want = (int(text.per_layer_config[i].num_key_value_heads), int(text.per_layer_config[i].head_dim))
        have = target.kv_shape(stores[kind])
        if want != tuple(have):
            raise InputError(f"Assistant layer {i} ({kind}) reads keys of (heads, head dim) {want}, but the target's "
                             f"layer {stores[kind]} stores {tuple(have)}: the assistant belongs to another Gemma 4 size.")
    return stores


class AssistantDrafter:
    """Chains of k tokens from a Gemma 4 assistant reading the target's cache in place, greedy
    (argmax, as HF) or sampled (with q, so that speculative sampling stays exact)."""

    hidden_layers = (-1,)  # the target's final normed hidden state: the first step's state

    def __init__(self, assistant: PreTrainedModel, target: Target | PreTrainedModel):
        self.target = target if isinstance(target, Target) else Target(target)
        self.assistant = assistant.eval()
        self.head = self.assistant  # what it owns beside the target (`measure.memory`): the whole assistant
        self.stores = check_pair(assistant.config, self.target)
        self.window = int(assistant.config.get_text_config().sliding_window)

    def shared_kv(self, cache: KVCache) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The store layers' committed keys and values as HF's `shared_kv_states`, views of the
        target's cache (nothing copied, nothing written): per layer type, (1, Hk_i, L, hd_i)
        each; sliding layers only their last W + 1 slots (see the module docstring)."""
        kv = {}
        for kind, i in self.stores.items():
            k, v = cache.layer(i)  # (1, Hk_i, L, hd_i) each
            if kind == "sliding_attention":
                k, v = k[:, :, -(self.window + 1):], v[:, :, -(self.window + 1):]  # (1, Hk_i, min(L, W + 1), hd_i)
            kv[kind] = (k, v)
        return kv

    @torch.no_grad()
    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        L, D = inp.cache.length, self.target.hidden_size
        if inp.tokens.shape != (1, L + 1) or inp.hidden.shape != (1, D):
            raise InputError(f"AssistantDrafter: expected tokens (1, {L + 1}) and hidden (1, {D}) for a cache of {L} "
                             f"positions, got {tuple(inp.tokens.shape)} and {tuple(inp.hidden.shape)}.")
        dev, dtype = self.target.device, self.assistant.dtype
        kv = self.shared_kv(inp.cache)
        position = torch.full((1, 1), L, dtype=torch.long, device=dev)  # the same for every step
        state = inp.hidden.to(dev, dtype)[:, None]  # (1, 1, D)
        last = inp.tokens[:, -1:].to(dev)  # (1, 1)
        drafted, qs = [], []
        for _ in range(k):
            x = torch.cat([self.target.embed_tokens(last).to(dtype), state], dim=-1)  # (1, 1, 2D)
            out = self.assistant(inputs_embeds=x, position_ids=position, shared_kv_states=kv, use_cache=False)
            logits = out.logits[0, -1]  # (V,)
            if sampling.greedy:
                tok = int(logits.argmax())
            else:
                q = probs_from_logits(logits[None], sampling)  # (1, V), made as the target's p is
                tok = int(sample(q, generator))
                qs.append(q)
            drafted.append(tok)
            last = torch.tensor([[tok]], dtype=torch.long, device=dev)
            state = out.last_hidden_state  # (1, 1, D): post_projection, the next step's state
        return Draft(tokens=torch.tensor(drafted, dtype=torch.long), q=torch.cat(qs) if qs else None)

    def update(self, drafted: int, accepted: int) -> None:
        """Nothing to roll back: the assistant keeps no state between rounds."""

    def inference_bytes(self) -> int:
        """Bytes the assistant adds beside the target: its parameters and buffers (its own LM head
        included). It holds no KV cache."""
        return sum(t.numel() * t.element_size() for t in [*self.assistant.parameters(), *self.assistant.buffers()])


def load_assistant(directory: str | Path, target: Target | PreTrainedModel) -> AssistantDrafter:
    """A saved `Gemma4AssistantForCausalLM` folder, read locally (no download) in the target's
    dtype, as a drafter for `target`; a folder or target that does not fit is refused first."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    if not is_assistant_dir(directory):
        raise InputError(f"{directory} is not a Gemma 4 assistant folder: it needs a config.json with model_type "
                         f"{MODEL_TYPE!r} (e.g. a download of google/gemma-4-e2b-it-assistant).")
    t = target if isinstance(target, Target) else Target(target)  # a multimodal checkpoint: its text decoder
    check_pair(Gemma4AssistantConfig.from_pretrained(directory, local_files_only=True), t)
    model = Gemma4AssistantForCausalLM.from_pretrained(directory, local_files_only=True, dtype=t.dtype)
    return AssistantDrafter(model.to(t.device), t)
