"""Training a Gemma 4 assistant for a Gemma 4 target: mtpspec's data and distillation, in the
drafter architecture the serving engines already run (issue 50).

Letters: T positions of one sequence, D the target's hidden size, Da the assistant's, K unrolled
draft steps, V vocabulary, W the sliding window.

An mtpspec head and a Gemma 4 assistant share the design (no cache of their own, the target's
keys and values read in place, a recurrent state) but not the layout: the assistant projects
[embedding; state] down to its own width, runs Gemma 4 decoder layers whose attention reads the
target's store layers (`core/assistant.py`), projects back as the next state, and scores with
its own LM head. `mtpspec train --kind gemma4-assistant` trains that layout directly, so the
result is a `Gemma4AssistantForCausalLM` folder that HF's `generate(assistant_model=...)` loads
as it is and mtpspec's `--head` drafts with: nothing to convert, nothing lost in a conversion.

Training unrolls the assistant exactly as it drafts (`AssistantDrafter.propose`). Row t of a
sequence stands for "positions 0..t are committed, x_{t+1} is the token just emitted": step j
feeds [target embedding of x_{t+1+j}; state_j] at position t + 1 (state_0 = the target's final
normed hidden state at t), attends the store layers' keys at positions 0..t (sliding layers:
t - W..t), and is scored against the target's distribution for x_{t+2+j} (its top-k at row
t + 1 + j) plus the data's token. All rows of a sequence run as one forward under per-row
masks. The target's forward runs in the loop (no grad): the cached activations hold one
layer's keys, the assistant reads two.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..config import TrainConfig
from ..core.gemma4 import store_layers
from ..core.target import Target
from ..errors import InputError
from .activations import Sample

ASSISTANT_DIR = "assistant"  # where kind "gemma4-assistant" saves its model (`--head RUN/assistant`)


def new_assistant(target: Target, cfg: TrainConfig) -> nn.Module:
    """A fresh `Gemma4AssistantForCausalLM` for `target`: `cfg.assistant_layers` layers (sliding
    ones, the last full attention) of width `cfg.assistant_hidden`, each reading the target's
    store layer of its type (the same heads and head dims), the target's RoPE and window."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

    if target.model_type != "gemma4_text":
        raise InputError(f"--kind gemma4-assistant trains a drafter for a Gemma 4 target; this target is "
                         f"{target.model_type!r} (train an MTP head for it: --kind mtp).")
    if cfg.assistant_layers < 1 or cfg.assistant_hidden < 1:
        raise InputError(f"assistant_layers and assistant_hidden must be >= 1, got {cfg.assistant_layers} and "
                         f"{cfg.assistant_hidden}.")
    t = target.config
    stores = store_layers(t)
    if set(stores) != {"sliding_attention", "full_attention"}:
        raise InputError(f"A Gemma 4 assistant reads a sliding and a full-attention layer of the target; this one has "
                         f"{sorted(stores)} only.")
    (hk_s, hd_s), (hk_f, hd_f) = target.kv_shape(stores["sliding_attention"]), target.kv_shape(stores["full_attention"])
    n = cfg.assistant_layers
    text = Gemma4TextConfig(
        vocab_size=target.vocab_size, hidden_size=cfg.assistant_hidden, intermediate_size=4 * cfg.assistant_hidden,
        num_hidden_layers=n, layer_types=["sliding_attention"] * (n - 1) + ["full_attention"],
        num_attention_heads=target.num_heads, head_dim=hd_s, num_key_value_heads=hk_s, global_head_dim=hd_f,
        attention_k_eq_v=True, num_global_key_value_heads=hk_f,  # k_eq_v: the full layers' own key/value heads
        sliding_window=int(t.sliding_window), rope_parameters=t.rope_parameters, rms_norm_eps=float(t.rms_norm_eps),
        hidden_activation=t.hidden_activation, max_position_embeddings=int(t.max_position_embeddings),
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, num_kv_shared_layers=n,
        pad_token_id=t.pad_token_id, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id)
    torch.manual_seed(cfg.seed)
    model = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=text, backbone_hidden_size=target.hidden_size,
                                                             use_ordered_embeddings=False))
    # Saved with the folder: HF's assisted generation reads its drafts per round from here (and
    # fails without it); a constant k, the steps it was trained to draft.
    model.generation_config.num_assistant_tokens = cfg.max_draft_tokens
    model.generation_config.num_assistant_tokens_schedule = "constant"
    return model


def _additive(visible: torch.Tensor) -> torch.Tensor:
    """(T, S) bool -> (1, 1, T, S) float mask: 0 where visible, the dtype's lowest elsewhere."""
    return torch.zeros(visible.shape, device=visible.device).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]


def unroll(assistant: nn.Module, target: Target, ids: torch.Tensor, K: int) -> list[torch.Tensor]:
    """(1, T) one sequence -> K logits (1, T, V): step j at row t, the assistant's j-th draft
    after the committed x_0..x_t with x_{t+1} emitted, its inputs the data's tokens (teacher
    forcing, as a round whose earlier drafts were all accepted sees them)."""
    T, dev = ids.shape[1], ids.device
    with torch.no_grad(), torch.autocast(dev.type, enabled=False):
        cache = target.new_cache()
        hidden = target.forward(ids, cache, hidden_layers=(-1,)).hidden.float()  # (1, T, D)
        kv = {kind: tuple(x.float() for x in cache.layer(i)) for kind, i in store_layers(target.config).items()}
    W = int(assistant.config.get_text_config().sliding_window)
    t, s = torch.arange(T, device=dev)[:, None], torch.arange(T, device=dev)[None, :]
    masks = {"full_attention": _additive(s <= t), "sliding_attention": _additive((s <= t) & (s >= t - W))}
    position = torch.arange(1, T + 1, device=dev)[None]  # (1, T): row t drafts at position t + 1, every step
    state, out = hidden, []
    for j in range(K):
        tok = ids[:, (torch.arange(T, device=dev) + 1 + j).clamp(max=T - 1)]  # (1, T): x_{t+1+j}; rows past the end are not scored
        with torch.no_grad():
            e = target.embed_tokens(tok).float()  # (1, T, D): the target's embedding, as drafting feeds it
        x = assistant.pre_projection(torch.cat([e, state.to(e.dtype)], -1))  # (1, T, Da)
        h = assistant.model(inputs_embeds=x, attention_mask=masks, position_ids=position, shared_kv_states=kv,
                            use_cache=False).last_hidden_state  # (1, T, Da)
        state = assistant.post_projection(h)  # (1, T, D)
        out.append(assistant.lm_head(h))  # (1, T, V)
    return out


class AssistantObjective:
    """The assistant unrolled for K steps over whole sequences, distilled on the target's top-k
    and the data's tokens (`train.distill_loss`); reports greedy acceptance as the head's does."""

    def __init__(self, assistant: nn.Module, target: Target, cfg: TrainConfig):
        self.assistant, self.target, self.cfg = assistant, target, cfg

    def module(self) -> nn.Module:
        return self.assistant

    @property
    def device(self) -> torch.device:
        return next(self.assistant.parameters()).device

    def _steps(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
        """Per sequence of the batch, its K step logits (1, T_b, V)."""
        m = getattr(model, "module", model)  # under DDP, the wrapped assistant's parts
        return [unroll(m, self.target, batch["ids"][b:b + 1, :n], self.cfg.max_draft_tokens)
                for b, n in enumerate(batch["lengths"].tolist())]

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        from .train import distill_loss, valid_at

        total, rows = torch.zeros((), device=self.device), 0
        for b, steps in enumerate(self._steps(model, batch)):
            one = {k: v[b:b + 1] for k, v in batch.items()}
            n = steps[0].shape[1]
            t = torch.arange(n, device=self.device)[None]  # (1, T_b)
            for j, lg in enumerate(steps):
                pos = (t + 1 + j).clamp(max=n - 1)  # the teacher's row for x_{t+2+j}
                valid = valid_at(one, t + 2 + j)  # (1, T_b)
                labels = one["ids"][:, (t[0] + 2 + j).clamp(max=n - 1)]
                s, r = distill_loss(lg, one["top_logp"][:, pos[0]], one["top_ids"][:, pos[0]], labels, valid, None,
                                    self.cfg.label_weight, self.cfg.tv_weight)
                total, rows = total + self.cfg.step_decay ** j * s, rows + r
        return total, rows

    @torch.no_grad()
    def acceptance(self, samples: Sequence[Sample], batch_size: int) -> dict[str, float]:
        """Greedy tokens per target forward on held-out samples, as `MTPObjective.acceptance`
        reports them: `accept` (every row a round) and `accept_rounds` (the rounds greedy
        decoding meets, walked from each answer's first token), and pos1..posK."""
        from .devices import autocast
        from .train import eval_batches, round_roots, valid_at

        K = self.cfg.max_draft_tokens
        leads, tokens, rounds = [], 0, 0
        for batch in eval_batches(samples, batch_size, self.cfg.micro_batch_tokens, self.device):
            with autocast(self.device, self.cfg.bf16):
                per_seq = self._steps(self.assistant, batch)
            for b, steps in enumerate(per_seq):
                one = {k: v[b:b + 1] for k, v in batch.items()}
                n = steps[0].shape[1]
                t = torch.arange(n, device=self.device)
                hits = torch.stack([lg[0].argmax(-1) == one["ids"][0, (t + 2 + j).clamp(max=n - 1)]
                                    for j, lg in enumerate(steps)], -1).long().cumprod(-1)  # (T_b, K)
                valid = valid_at(one, (t + 1 + K)[None])[0]  # all K steps have a label
                leads.append(hits[valid].float().cpu())
                acc = hits.sum(-1).tolist()
                walk = round_roots(acc, valid.tolist(), int(one["prompt_lens"]) - 1)
                tokens, rounds = tokens + sum(acc[r] + 1 for r in walk), rounds + len(walk)
        r = torch.cat(leads) if leads else torch.zeros(0, K)
        return {"accept": 1.0 + float(r.sum(-1).mean()) if len(r) else 1.0, "accept_rounds": tokens / max(1, rounds),
                **{f"pos{j + 1}": float(r[:, j].sum() / max(1, len(r))) for j in range(K)}}
