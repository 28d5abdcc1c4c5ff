"""Training an MTP head (or a baseline draft model) on cached target activations; the target
stays frozen throughout.

Letters: B sequences, T positions, K unrolled draft steps, k teacher top-k, V' draft vocab.

The MTP head is trained exactly as it drafts: row t of a sequence stands for "the last verified
position is t"; the head unrolls K steps with its own recurrent state, feeding the data's
tokens (the target's own greedy output) and attending to the target's cached keys 0..t. Step j
is distilled against the target's distribution at position t+1+j (top-k log-probs), plus a
small hard-label term. The baseline draft model (a standalone small LM, run by Hugging Face
assisted generation) is trained on the same data with the same teacher, next-token only.

Computes on the CPU or a CUDA GPU (`devices`: the data is collated on the CPU and each batch
moves to the device). Runs under `torchrun --nproc_per_node=N` with DistributedDataParallel
(gloo on CPU, NCCL on GPU): each rank takes a slice of every global batch and the loss is
normalised by the global row count, so N processes follow the same curve as one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..config import HeadConfig, TrainConfig
from ..core.head import MTPHead
from ..core.target import Target
from ..errors import DataError, InputError
from ..models import load_target
from ..pretrained import load_head, load_head_config
from .activations import MANIFEST, Sample, Samples, Shard, build_cache, cache_shards, load_cache, online_samples, token_frequencies
from .assistant import ASSISTANT_DIR, AssistantObjective, new_assistant
from .devices import autocast, process_group_backend, resolve_device, to_device
from .shards import DataRef

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
DRAFT_MODEL_DIR = "draft_model"  # where kind "draft-model" saves its model (`mtpspec bench --draft-model`)
# Held-out tokens per target forward below which a run ends by saying what to change: a head
# this close to 1.0 (no draft accepted) barely speeds decoding up.
LOW_ACCEPTANCE = 1.2

log = logging.getLogger("mtpspec.train")


# -- batching ---------------------------------------------------------------------------------
def collate(samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into (B, T, ...) tensors plus lengths."""
    B = len(samples)
    T = max(s.ids.shape[0] for s in samples)
    Hk, _, hd = samples[0].keys.shape
    Fdim, k = samples[0].hidden.shape[1], samples[0].top_ids.shape[1]
    out = {
        "ids": torch.zeros(B, T, dtype=torch.long),
        "hidden": torch.zeros(B, T, Fdim, dtype=samples[0].hidden.dtype),
        "keys": torch.zeros(B, Hk, T, hd, dtype=samples[0].keys.dtype),
        "values": torch.zeros(B, Hk, T, hd, dtype=samples[0].values.dtype),
        "top_logp": torch.full((B, T, k), -1e4, dtype=torch.float32),
        "top_ids": torch.zeros(B, T, k, dtype=torch.long),
        "lengths": torch.tensor([s.ids.shape[0] for s in samples]),
        "prompt_lens": torch.tensor([s.prompt_len for s in samples]),
    }
    for i, s in enumerate(samples):
        n = s.ids.shape[0]
        out["ids"][i, :n] = s.ids
        out["hidden"][i, :n] = s.hidden
        out["keys"][i, :, :n] = s.keys
        out["values"][i, :, :n] = s.values
        out["top_logp"][i, :n] = s.top_logp.float()
        out["top_ids"][i, :n] = s.top_ids
    return out


def token_chunks(samples: Sequence[Sample], max_tokens: int) -> list[list[Sample]]:
    """Consecutive groups of samples whose padded size (count x longest) stays within
    max_tokens (at least one sample each; 0 = one group): the unrolled head's logits are
    K x V' floats per token, so a batch of long passages must be run in parts."""
    groups: list[list[Sample]] = []
    longest = 0
    for s in samples:
        n = s.ids.shape[0]
        if groups and (max_tokens <= 0 or (len(groups[-1]) + 1) * max(n, longest) <= max_tokens):
            groups[-1].append(s)
            longest = max(n, longest)
        else:
            groups.append([s])
            longest = n
    return groups


def eval_batches(samples: Sequence[Sample], batch_size: int, max_tokens: int,
                 device: torch.device = torch.device("cpu")) -> Iterator[dict[str, torch.Tensor]]:
    """Collated batches of `batch_size` samples, each cut into token-bounded parts, on `device`."""
    for i in range(0, len(samples), batch_size):
        for part in token_chunks(by_answer_length(samples[i:i + batch_size]), max_tokens):
            yield to_device(collate(part), device)


def valid_at(batch: dict[str, torch.Tensor], pos: torch.Tensor) -> torch.Tensor:
    """(B, R) bool: whether x at (B, R) positions `pos` exists and is a response token."""
    return (pos < batch["lengths"].unsqueeze(1)) & (pos >= batch["prompt_lens"].unsqueeze(1))


def target_rows(batch: dict[str, torch.Tensor], offset: int) -> torch.Tensor:
    """(B, T) bool: rows t whose predicted token x_{t+offset} exists and is a response token."""
    B, T = batch["ids"].shape
    return valid_at(batch, torch.arange(T, device=batch["ids"].device).unsqueeze(0) + offset)


def answer_rows(batch: dict[str, torch.Tensor], before: int) -> torch.Tensor:
    """(B, R) long: each sequence's rows from `before` positions ahead of its answer to its end
    (row t's K drafts predict x_{t+2}..x_{t+1+K}, so before = 1 + K is the first row that
    predicts an answer token), R the longest such span; a shorter one is padded with positions
    past its end. Computing these rows instead of every row from the batch's shortest prompt on
    cut the rows of a batch of the kept data from 2.8x the rows with a term to 1.8x (1.35x with
    `by_answer_length`).

    A sample with no answer token (its prompt cut at the cache's `max_len`) gets one row, its
    last position, whose terms are all invalid: a batch made only of such samples has a loss
    of zero over zero rows instead of an empty grid."""
    first = (batch["prompt_lens"] - before).clamp_min(0).minimum(batch["lengths"] - 1)  # (B,)
    R = int((batch["lengths"] - first).max())
    return first.unsqueeze(1) + torch.arange(R, device=first.device)


def by_answer_length(samples: Sequence[Sample]) -> list[Sample]:
    """Longest answer first, so that the token-bounded parts of a batch (`token_chunks`) hold
    answers of similar lengths and `answer_rows` pads little. The summed loss does not depend
    on the order."""
    return sorted(samples, key=lambda s: s.prompt_len - s.ids.shape[0])


def gather_rows(x: torch.Tensor, pos: torch.Tensor, fill: float | int) -> torch.Tensor:
    """x (B, T, ...) at (B, R) positions -> (B, R, ...), `fill` where a position is past T - 1."""
    T, shape = x.shape[1], (*pos.shape, *([1] * (x.dim() - 2)))
    idx = pos.clamp(max=T - 1).view(shape).expand(-1, -1, *x.shape[2:])
    return x.gather(1, idx).masked_fill((pos >= T).view(shape), fill)


def round_roots(accepted: Sequence[int], valid: Sequence[bool], start: int) -> list[int]:
    """The rows where greedy decoding roots its rounds over one teacher-forced answer: a round
    rooted at row t accepts accepted[t] drafts and emits one token of the target's own, so the
    next is rooted at t + accepted[t] + 1; from `start` up to the first row not in `valid`.
    Each round emits accepted[t] + 1 tokens."""
    roots, t = [], start
    while 0 <= t < len(valid) and valid[t]:
        roots.append(t)
        t += accepted[t] + 1
    return roots


def distill_loss(logits: torch.Tensor, top_logp: torch.Tensor, top_ids: torch.Tensor, labels: torch.Tensor,
                 valid: torch.Tensor, vocab_map: torch.Tensor | None, label_weight: float,
                 tv_weight: float = 0.0, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Sum over valid rows of CE(teacher top-k, student) + label_weight * CE(label, student)
    + tv_weight * TV(teacher, student). The total-variation distance is what speculative
    sampling loses (a draft from q passes with probability 1 - TV(p, q)): a loss aligned with
    acceptance rather than with likelihood. Teacher mass is its renormalised top-k.

    logits: (B, T, V') student. top_logp/top_ids: (B, T, k) teacher over the full vocabulary.
    vocab_map: (V,) full id -> draft index or -1 (None: identity). Teacher mass on tokens the
    draft vocabulary lacks is dropped and the rest renormalised. weights: (B, T) per-row loss
    weights (None: 1). Returns (sum, row count).
    """
    logp = logits[valid].float().log_softmax(-1)  # (N, V')
    t_logp, t_ids, y = top_logp[valid], top_ids[valid], labels[valid]  # (N, k), (N, k), (N,)
    if vocab_map is not None:
        t_ids, y = vocab_map[t_ids], vocab_map[y]
    lp = logp.gather(-1, t_ids.clamp_min(0))  # (N, k) student log-probs of the teacher's tokens
    # a teacher token outside this row's vocabulary (-1 in vocab_map, or a masked copy token: -inf)
    ok = (t_ids >= 0) & torch.isfinite(lp)
    p = t_logp.masked_fill(~ok, -1e4).softmax(-1)  # (N, k) renormalised teacher
    lp = lp.masked_fill(~ok, 0.0)
    soft = -(p * lp).sum(-1)  # (N,)
    ly = logp.gather(-1, y.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (N,)
    hard = -ly.masked_fill((y < 0) | ~torch.isfinite(ly), 0.0)
    loss = soft + label_weight * hard
    if tv_weight:
        q = lp.exp() * ok  # (N, k) student mass on the teacher's tokens
        loss = loss + tv_weight * 0.5 * ((p - q).abs().sum(-1) + (1 - q.sum(-1)).clamp_min(0))
    if weights is not None:
        loss = loss * weights[valid]
    return loss.sum(), int(valid.sum())


# -- the two objectives: MTP head, draft model ---------------------------------------------------
class MTPObjective:
    """Unrolls the head for K steps over whole sequences; reports greedy acceptance."""

    def __init__(self, head: MTPHead, cfg: TrainConfig):
        self.head, self.cfg = head, cfg
        self.vocab_map: torch.Tensor | None = None
        if head.draft_ids is not None:
            dev = head.draft_ids.device
            m = torch.full((head.target.vocab_size,), -1, dtype=torch.long, device=dev)
            m[head.draft_ids] = torch.arange(head.draft_ids.numel(), device=dev)
            self.vocab_map = m

    def module(self) -> nn.Module:
        return self.head

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        dt = torch.float32
        K = self.cfg.max_draft_tokens
        rows = answer_rows(batch, 1 + K)  # (B, R): the rows with a term (earlier ones predict only prompt tokens)
        vocab = self.batch_vocab(batch, rows)
        logits = vocab.mask(model(batch["hidden"].to(dt), batch["ids"], batch["keys"].to(dt), batch["values"].to(dt),
                                  K, rows, vocab.extra_rows))
        total, rows_n = torch.zeros((), device=rows.device), 0
        ids = batch["ids"]
        D = self.head.target.hidden_size
        use_feat = self.cfg.feature_weight > 0 and self.head.config.hidden_layers[-1] == -1
        weights = self._round_weights(logits, batch, rows, vocab.ids) if self.cfg.round_weight else None
        for j, (normed, lg) in enumerate(logits):
            # step j at row t predicts x_{t+2+j}; the teacher row is t+1+j
            valid = valid_at(batch, rows + 2 + j)  # (B, R)
            top_logp = gather_rows(batch["top_logp"], rows + 1 + j, -1e4)  # (B, R, k)
            top_ids = gather_rows(batch["top_ids"], rows + 1 + j, 0)
            labels = gather_rows(ids, rows + 2 + j, 0)  # (B, R)
            s, n = distill_loss(lg, top_logp, top_ids, labels, valid, vocab.map, self.cfg.label_weight,
                                self.cfg.tv_weight, weights)
            if use_feat:  # the target's final hidden at t+1+j is the state the head should reach
                h = gather_rows(batch["hidden"][..., -D:], rows + 1 + j, 0).float()
                s = s + self.cfg.feature_weight * F.smooth_l1_loss(normed[valid].float(), h[valid], reduction="none").mean(-1).sum()
            # step j only counts if steps 0..j-1 were accepted: weight it down geometrically
            total, rows_n = total + self.cfg.step_decay ** j * s, rows_n + n
        return total, rows_n

    def batch_vocab(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> BatchVocab:
        """The vocabulary the head scores on this batch: its draft vocabulary, plus (with
        `copy_context`) every token of the batch outside it, each available to a row only once
        the row's context (x_0..x_{t+1}, what drafting at root t sees) holds it."""
        if self.head.draft_ids is None or not self.cfg.copy_context:
            return BatchVocab(self.head.draft_ids, self.vocab_map)
        ids, lengths = batch["ids"], batch["lengths"]
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)
        real = pos.unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
        all_ids, w = self.head.round_vocab(ids[real])  # drafting's own rule: the draft vocabulary, then the rest
        if w is None:
            return BatchVocab(self.head.draft_ids, self.vocab_map)
        V = self.head.draft_ids.numel()
        extra = all_ids[V:]  # (E,)
        hit = (ids.unsqueeze(-1) == extra) & real.unsqueeze(-1)  # (B, T, E)
        first = torch.where(hit, pos.view(1, T, 1), T).amin(1)  # (B, E): first position, T if absent
        available = first.unsqueeze(1) <= rows.unsqueeze(-1) + 1  # (B, R, E): rows (B, R) are root positions t
        m = self.vocab_map.clone()
        m[extra] = torch.arange(V, V + extra.numel(), device=m.device)
        return BatchVocab(all_ids, m, w, available)

    def _leading_hits(self, logits: list[tuple[torch.Tensor, torch.Tensor]], ids: torch.Tensor,
                      rows: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, R, K) long: 1 at step j of row [b, r] (position t = rows[b, r]) while the head's
        greedy drafts of steps 0..j all equal the data's tokens x_{t+2}..x_{t+2+j}, else 0.
        vocab_ids: the full id of each logit column (None: the full vocabulary)."""
        ok = []
        for j, (_, lg) in enumerate(logits):
            pred = lg.argmax(-1)  # (B, R)
            if vocab_ids is not None:
                pred = vocab_ids[pred]
            ok.append(pred == gather_rows(ids, rows + 2 + j, -1))
        return torch.stack(ok, -1).long().cumprod(-1)

    @torch.no_grad()
    def _round_weights(self, logits: list[tuple[torch.Tensor, torch.Tensor]], batch: dict[str, torch.Tensor],
                       rows: torch.Tensor, vocab_ids: torch.Tensor | None) -> torch.Tensor:
        """(B, R) loss weights: 1 + round_weight on the rows where greedy decoding with the head
        as it is now would start a round (its teacher-forced drafts, walked as decoding walks
        them), 1 elsewhere."""
        ids = batch["ids"]
        accepted = self._leading_hits(logits, ids, rows, vocab_ids).sum(-1).tolist()  # (B, R)
        valid = valid_at(batch, rows + 2).tolist()  # rows whose first draft has a label
        w = torch.ones(rows.shape, device=rows.device)
        for i, (pl, first) in enumerate(zip(batch["prompt_lens"].tolist(), rows[:, 0].tolist())):
            roots = round_roots(accepted[i], valid[i], pl - 1 - first)  # the first answer token roots the first
            w[i, roots] += self.cfg.round_weight
        return w

    @torch.no_grad()
    def acceptance(self, samples: Sequence[Sample], batch_size: int) -> dict[str, float]:
        """Greedy tokens per target forward on held-out samples, two ways. `accept`: if every
        row were a round, 1 + the number of leading steps whose draft equals the data's next
        token. `accept_rounds`: as decoding meets them, each answer walked round by round from
        its first token (a round at row t accepts a drafts and the next starts at t + a + 1).
        Rounds start right after a rejection, where the head did worst, so `accept` runs above
        what decoding gets (reports/acceptance/transfer/); `accept_rounds` is the one that ranks heads.
        The head scores the vocabulary it trains on (`copy_context` adds the context's tokens)."""
        K = self.cfg.max_draft_tokens
        runs, walks = [torch.zeros(0, K)], []
        for run, w in self.round_walks(samples, batch_size):
            runs.append(run.float().cpu())
            walks += w
        r = torch.cat(runs)  # (N, K)
        tokens, rounds = sum(a + 1 for w in walks for a in w), sum(len(w) for w in walks)
        return {"accept": 1.0 + float(r.sum(-1).mean()) if len(r) else 1.0, "accept_rounds": tokens / max(1, rounds),
                **{f"pos{j + 1}": float(r[:, j].sum() / max(1, len(r))) for j in range(K)}}

    @torch.no_grad()
    def round_walks(self, samples: Sequence[Sample], batch_size: int) -> Iterator[tuple[torch.Tensor, list[list[int]]]]:
        """Per collated batch part: the leading hits (N, K) of its rows whose K steps all have a
        label, and per sequence (in the part's order: `by_answer_length`) the drafts accepted by
        each round of its greedy walk, first round first."""
        K = self.cfg.max_draft_tokens
        for b in eval_batches(samples, batch_size, self.cfg.micro_batch_tokens, self.device):
            rows = answer_rows(b, 1 + K)  # (B, R): the first row whose last draft predicts an answer token
            vocab = self.batch_vocab(b, rows)
            with autocast(self.device, self.cfg.bf16):
                logits = vocab.mask(self.head(b["hidden"].float(), b["ids"], b["keys"].float(), b["values"].float(), K,
                                              rows, vocab.extra_rows))
            valid = valid_at(b, rows + 1 + K)  # all K steps have a label
            lead = self._leading_hits(logits, b["ids"], rows, vocab.ids)  # (B, R, K): 1 while every earlier draft matched
            walks = []
            for acc, ok_row, pl, first in zip(lead.sum(-1).tolist(), valid.tolist(), b["prompt_lens"].tolist(),
                                              rows[:, 0].tolist()):
                roots = round_roots(acc, ok_row, pl - 1 - first)  # the first round's root: the first answer token
                walks.append([acc[t] for t in roots])
            yield lead[valid], walks


@dataclass(frozen=True)
class BatchVocab:
    """What the head's logit columns mean on one batch: ids (V'',) the full id of each column
    (None: the whole vocabulary), map (V,) full id -> column or -1 (None: identity), extra_rows
    (E, D) the LM-head rows scored after the draft vocabulary's, available (B, R, E) whether row
    r may draft extra token e yet (None: every column always)."""

    ids: torch.Tensor | None
    map: torch.Tensor | None
    extra_rows: torch.Tensor | None = None
    available: torch.Tensor | None = None

    def mask(self, logits: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each step's logits with the extra columns a row may not draft yet at -inf."""
        if self.available is None:
            return logits
        E = self.available.shape[-1]
        return [(n, torch.cat([lg[..., :-E], lg[..., -E:].masked_fill(~self.available, float("-inf"))], -1))
                for n, lg in logits]


class DraftModelObjective:
    """A standalone small causal LM distilled on the target's next-token distribution."""

    def __init__(self, model: nn.Module, cfg: TrainConfig):
        self.model, self.cfg = model, cfg

    def module(self) -> nn.Module:
        return self.model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        ids = batch["ids"]
        mask = (torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < batch["lengths"].unsqueeze(1)).long()
        valid = target_rows(batch, 1)  # (B, T)
        # the LM head only from the first column with a loss row on (B, T - start, V): a
        # full-vocabulary row is most of a step's cost, and prompts are most of the rows
        start = int(valid.any(0).nonzero()[0, 0]) if bool(valid.any()) else ids.shape[1] - 1
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=ids.shape[1] - start).logits
        labels = F.pad(ids[:, 1:], (0, 1))[:, start:]
        return distill_loss(logits, batch["top_logp"][:, start:], batch["top_ids"][:, start:], labels,
                            valid[:, start:], None, self.cfg.label_weight)

    @torch.no_grad()
    def acceptance(self, samples: Sequence[Sample], batch_size: int) -> dict[str, float]:
        """Greedy next-token agreement with the data (the draft model's step-1 rate)."""
        hit = tot = 0
        for b in eval_batches(samples, batch_size, self.cfg.micro_batch_tokens, self.device):
            mask = (torch.arange(b["ids"].shape[1], device=self.device).unsqueeze(0) < b["lengths"].unsqueeze(1)).long()
            with autocast(self.device, self.cfg.bf16):
                pred = self.model(input_ids=b["ids"], attention_mask=mask).logits.argmax(-1)
            valid = target_rows(b, 1)
            hit += int((pred == F.pad(b["ids"][:, 1:], (0, 1)))[valid].sum())
            tot += int(valid.sum())
        return {"pos1": hit / max(1, tot)}


def draft_model(target: Target, cfg: TrainConfig) -> nn.Module:
    """A small Llama with its own (tied) embedding table over the target's full vocabulary,
    usable as `assistant_model` in Hugging Face assisted generation. With
    `cfg.draft_model_init == "target"` it is the target's own first layers: see
    `draft_model_from_target`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if cfg.draft_model_init == "target":
        return draft_model_from_target(target, cfg)
    D = cfg.draft_model_hidden
    c = LlamaConfig(vocab_size=target.vocab_size, hidden_size=D, intermediate_size=4 * D,
                    num_hidden_layers=cfg.draft_model_layers, num_attention_heads=max(1, D // 32),
                    num_key_value_heads=max(1, D // 64), max_position_embeddings=8192, tie_word_embeddings=True,
                    bos_token_id=getattr(target.config, "bos_token_id", None),
                    eos_token_id=getattr(target.config, "eos_token_id", None),
                    pad_token_id=getattr(target.config, "pad_token_id", None))
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(c)


def draft_model_from_target(target: Target, cfg: TrainConfig) -> nn.Module:
    """A draft model that starts as a copy of the target's embedding (and LM head), its first
    `cfg.draft_model_layers` decoder layers and its final norm, in fp32: a drafter that owns
    what the MTP head borrows (issue 47's second baseline size), started where a practitioner
    would start it. The copy is its own: nothing is shared with the target at decode time."""
    from transformers import LlamaForCausalLM

    check_draft_model_init(target.config, cfg)
    t = target.config
    c = type(t).from_dict({**t.to_dict(), "num_hidden_layers": cfg.draft_model_layers})
    if getattr(c, "layer_types", None):
        c.layer_types = c.layer_types[:cfg.draft_model_layers]
    model = LlamaForCausalLM(c).float()
    source = dict(target.model.named_modules())
    with torch.no_grad():
        for name, module in model.named_modules():
            w = getattr(module, "weight", None)
            if not isinstance(w, nn.Parameter) or (name == "lm_head" and c.tie_word_embeddings):
                continue
            if name not in source:
                raise InputError(f"The target has no module {name!r} to copy into the draft model; use "
                                 "--draft-model-init random.")
            w.copy_(dense_weight_of(source[name]))
    return model


def check_draft_model_init(t: Any, cfg: TrainConfig) -> None:
    """Refuse, with the reason, a `draft_model_init` the target `t` (its config) cannot give:
    called before the teacher is cached, so a wrong flag fails in seconds, not after hours."""
    if cfg.kind != "draft-model" or cfg.draft_model_init != "target":
        return
    if getattr(t, "model_type", None) != "llama":
        raise InputError(f"--draft-model-init target copies a Llama target's layers; this target is "
                         f"{getattr(t, 'model_type', None)!r}. Use --draft-model-init random.")
    if cfg.draft_model_hidden != t.hidden_size:
        raise InputError(f"--draft-model-init target copies the target's layers, so --draft-model-hidden must be its "
                         f"width, {t.hidden_size} (got {cfg.draft_model_hidden}).")
    if cfg.draft_model_layers > t.num_hidden_layers:
        raise InputError(f"--draft-model-layers {cfg.draft_model_layers} is more than the target's "
                         f"{t.num_hidden_layers} layers.")


def dense_weight_of(module: nn.Module) -> torch.Tensor:
    """A module's weight as a dense fp32 tensor, whether it is a dense parameter or a GGUF
    file's blocks (`qmodules`: dequantized to the values a dense load holds)."""
    from ..core.qmodules import dense_weight

    q = getattr(module, "qweight", None)
    return dense_weight(q, torch.float32) if q is not None else module.weight.detach().float()


# -- the loop ---------------------------------------------------------------------------------
def _lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """The learning rate's multiplier at each step: linear warm-up over `warmup` steps, then
    cosine from 1 to 0.1 by step `total`."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def low_acceptance_advice(final: dict[str, float], cfg: TrainConfig, samples: int, step: int, total: int,
                          epochs: int, warmup: int) -> str | None:
    """What to change, when the head's held-out acceptance (`final`, from `MTPObjective.acceptance`)
    stays below LOW_ACCEPTANCE; None when it does not, or when nothing was held out."""
    accept = final.get("accept_rounds")
    if accept is None or accept >= LOW_ACCEPTANCE:
        return None
    stopped = ", stopped early by --max-steps" if step < total else ""
    return (f"warning: held-out acceptance is {accept:.2f} tokens per target forward (1.00 = no draft accepted), "
            f"so this head will barely speed decoding up. It ran {step} of {total} steps{stopped} ({epochs} epochs "
            f"over {samples} samples, {warmup} warm-up steps, peak lr {cfg.lr:g}). To do better: more data "
            "(`mtpspec data --num-samples`; a few thousand samples is a good start), more epochs (--epochs), a higher "
            "--lr, or a shorter warm-up (--warmup-steps); and check that the data was written by `mtpspec data` "
            "for this very target.")


def split(samples: Samples, cfg: TrainConfig) -> tuple[Samples, Samples]:
    """(train, held-out), a seeded shuffle of one data set (views: nothing is read). Several
    data sets are split one by one (see `train`), so adding a data set never moves a sample of
    another across the split."""
    order = list(range(len(samples)))
    random.Random(cfg.seed).shuffle(order)
    n_hold = int(round(cfg.holdout * len(samples))) if cfg.holdout else 0
    if len(samples) - n_hold < 1:
        raise DataError(f"Only {len(samples)} samples: nothing left to train on after the held-out split.")
    return samples.pick(order[n_hold:]), samples.pick(order[:n_hold])


def epoch_batches(n: int, cfg: TrainConfig, epoch: int) -> list[list[int]]:
    """Deterministic per epoch, so a resumed run replays the same order."""
    order = list(range(n))
    random.Random(cfg.seed * 1000 + epoch).shuffle(order)
    return [order[i:i + cfg.batch_size] for i in range(0, n - cfg.batch_size + 1, cfg.batch_size)] or [order]


def init_distributed(device: torch.device = torch.device("cpu")) -> tuple[int, int]:
    """(rank, world size); joins the process group when launched by torchrun (NCCL for ranks
    on GPUs, gloo on the CPU).

    The group is left again at interpreter exit: a gloo group still alive when Python shuts
    down can abort the process ("terminate called without an active exception", SIGABRT)
    after all its work is done, and torchrun then reports the whole run as failed.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(process_group_backend(device))  # NCCL refuses CPU tensors, CUDA present or not
        atexit.register(_leave_process_group)
    return rank, world


def _leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def train(target: Target, cache_dir: str | Path | Samples | list[str | Path | Samples], out_dir: str | Path, cfg: TrainConfig,
          head_config: HeadConfig | None = None, resume: bool = False, max_steps: int | None = None,
          progress: bool = True, init_head: str | Path | None = None,
          device: str | torch.device | None = None) -> dict[str, Any]:
    """Train an MTP head, a draft model or a Gemma 4 assistant (`cfg.kind`); writes checkpoints,
    metrics.jsonl and the result (out_dir/head, out_dir/draft_model or out_dir/assistant) into out_dir.

    cache_dir: one activations directory or several (one per data set; each is split into
    train/held-out on its own), or `load_cache` views of them. `max_steps` stops early (as a
    kill would) - for tests and time-boxed runs. `init_head`: a saved head to continue from (its config and draft
    vocabulary are kept; `head_config` is then ignored), e.g. to go on training on more data.
    The head records `cfg.max_draft_tokens` as its `trained_draft_tokens`.
    `device`: where to compute (None: where the target is; it must be there already).
    """
    out = Path(out_dir)
    dev = target.device if device is None else resolve_device(device)
    if dev != target.device:
        raise InputError(f"train(device={str(dev)!r}) got a target on {target.device}: build the Target from a model "
                         f"moved there first (Target(model.to({str(dev)!r}))).")
    rank, world = init_distributed(dev)
    main = rank == 0
    if main:
        out.mkdir(parents=True, exist_ok=True)
    before = {k: v.clone() for k, v in target.model.state_dict().items()} if main else None

    train_set, held = Samples([]), Samples([])  # views of the shards on disk: read a batch at a time
    for d in cache_dir if isinstance(cache_dir, list) else [cache_dir]:
        tr, he = split(d if isinstance(d, Samples) else load_cache(d), cfg)
        train_set, held = train_set + tr, held + he
    hc = replace(head_config or HeadConfig(), trained_draft_tokens=cfg.max_draft_tokens)
    torch.manual_seed(cfg.seed)
    if cfg.kind == "mtp":
        if init_head is not None:
            head = load_head(init_head, target).float()
            trained = head.config.trained_draft_tokens  # None: saved untrained
            if trained is not None and trained < cfg.max_draft_tokens:
                raise InputError(f"{init_head} drafts at most {trained} tokens; "
                                 f"train it with max_draft_tokens <= that, not {cfg.max_draft_tokens}.")
        else:
            draft_ids = None
            if hc.draft_vocab_size:
                freq = token_frequencies(train_set, target.vocab_size)
                draft_ids = freq.topk(hc.draft_vocab_size).indices.sort().values
            head = MTPHead(target, hc, draft_ids).float()
        head.train()
        obj: MTPObjective | DraftModelObjective | AssistantObjective = MTPObjective(head, cfg)
    elif init_head is not None:
        raise InputError(f"init_head continues an MTP head; it does not apply to kind {cfg.kind!r}.")
    elif cfg.kind == "gemma4-assistant":
        obj = AssistantObjective(new_assistant(target, cfg).to(dev), target, cfg)
    else:
        obj = DraftModelObjective(draft_model(target, cfg).to(dev), cfg)
    module = obj.module()  # on dev: the head is made where its target is
    model: nn.Module = module
    if world > 1:
        model = nn.parallel.DistributedDataParallel(module, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    steps_per_epoch = len(epoch_batches(len(train_set), cfg, 0))
    epochs, warmup = cfg.plan(steps_per_epoch)  # a small set gets more passes and a shorter warm-up
    total = steps_per_epoch * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(warmup, total))
    step = 0
    ckpt = out / CHECKPOINT
    if resume and ckpt.is_file():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        # micro_batch_tokens only bounds memory (the same sums, in parts): a run killed for memory
        # may resume in smaller parts
        if {**state["train_config"], "micro_batch_tokens": 0} != {**asdict(cfg), "micro_batch_tokens": 0}:
            raise InputError(f"{ckpt} was written with other training settings; resume with the same flags "
                             "(--micro-batch-tokens may differ).")
        module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
    elif resume:
        raise InputError(f"--resume given but {ckpt} does not exist; start without --resume.")

    bar = tqdm(total=total, initial=step, desc=f"train {cfg.kind}", unit="step", disable=not (progress and main))
    metrics_f = (out / METRICS).open("a") if main else None
    stop = total if max_steps is None else min(total, max_steps)
    evaluated: tuple[int, dict[str, float]] = (-1, {})  # (step, held-out acceptance) of the last evaluation
    while step < stop:
        epoch, within = divmod(step, steps_per_epoch)
        idx = epoch_batches(len(train_set), cfg, epoch)[within]
        mine = idx[rank::world]  # this rank's slice of the global batch
        # Gradients of the summed loss, accumulated over token-bounded parts of the batch (DDP
        # syncs on each rank's last part only), then divided by the global row count, so the
        # step is that of one batch in one process whatever the parts and ranks.
        opt.zero_grad(set_to_none=True)
        parts = token_chunks(by_answer_length([train_set[i] for i in mine]), cfg.micro_batch_tokens)
        loss_sum, rows = torch.zeros((), device=dev), 0
        for n, part in enumerate(parts):
            sync = world == 1 or n == len(parts) - 1
            with contextlib.nullcontext() if sync else model.no_sync():  # type: ignore[operator]
                with autocast(dev, cfg.bf16):
                    part_sum, part_rows = obj.loss(model, to_device(collate(part), dev))
                part_sum.backward()
            loss_sum, rows = loss_sum + part_sum.detach(), rows + part_rows
        global_rows = torch.tensor(float(rows), device=dev)
        if world > 1:
            dist.all_reduce(global_rows)
        scale = world / float(global_rows.clamp_min(1))  # DDP averages gradients over ranks
        for p in module.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        gnorm = nn.utils.clip_grad_norm_(module.parameters(), cfg.clip)
        opt.step()
        sched.step()
        step += 1
        logged = torch.tensor([float(loss_sum.detach())], device=dev)
        if world > 1:
            dist.all_reduce(logged)
        rec: dict[str, Any] = {"step": step, "epoch": epoch, "loss": float(logged) / float(global_rows.clamp_min(1)),
                               "lr": sched.get_last_lr()[0], "grad_norm": float(gnorm)}
        if main and held and (step % cfg.eval_every == 0 or step == stop):
            module.eval()
            evaluated = (step, obj.acceptance(held, cfg.batch_size))
            rec.update(evaluated[1])
            module.train()
        if main:
            bar.update(1)
            bar.set_postfix({k: f"{v:.3f}" for k, v in rec.items() if k in ("loss", "accept", "accept_rounds", "pos1")})
            metrics_f.write(json.dumps(rec) + "\n")  # type: ignore[union-attr]
            metrics_f.flush()  # type: ignore[union-attr]
            if step % cfg.save_every == 0 or step == stop:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": module.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "step": step, "train_config": asdict(cfg)}, tmp)
                tmp.replace(ckpt)
    bar.close()
    result: dict[str, Any] = {"step": step, "total_steps": total, "epochs": epochs, "warmup_steps": warmup}
    if main:
        metrics_f.close()  # type: ignore[union-attr]
        module.eval()
        if step == total:
            _save_final(module, out)
        # the loop's last evaluation where it was at this step (online, an evaluation runs the target
        # over every held-out sample again)
        result["final"] = (evaluated[1] if evaluated[0] == step else obj.acceptance(held, cfg.batch_size)) if held else {}
        advice = low_acceptance_advice(result["final"], cfg, len(train_set), step, total, epochs, warmup)
        if advice is not None:
            result["advice"] = advice
            log.warning(advice)
        assert before is not None
        changed = [k for k, v in target.model.state_dict().items() if not torch.equal(v, before[k])]
        if changed:  # pragma: no cover - would be a bug in this module
            raise RuntimeError(f"target weights changed during training: {changed[:3]}")
    if world > 1:
        dist.barrier()
    return result


def _save_final(module: nn.Module, out: Path) -> None:
    if isinstance(module, MTPHead):
        module.save_pretrained(out / "head")
    elif type(module).__name__ == "Gemma4AssistantForCausalLM":
        module.save_pretrained(out / ASSISTANT_DIR)  # type: ignore[operator]
    else:
        module.save_pretrained(out / DRAFT_MODEL_DIR)  # type: ignore[operator]


def _cache_dirs(where: Path, given: bool, online: bool) -> list[Path]:
    """The activation directories in run folder `where` that an online run may read from (none
    for a cached run, which builds its own in --out). A folder named with --cache-from must hold
    some: a wrong path fails before any model loads."""
    if given and not online:
        raise InputError("--cache-from reads another run's caches in an --online run; add --online, or leave "
                         "--cache-from out to cache into --out.")
    if not online:
        return []
    if given and not where.is_dir():
        raise InputError(f"--cache-from {where}: no such folder (give a run folder that holds activations*/).")
    dirs = sorted(d for d in where.glob("activations*") if (d / MANIFEST).is_file()) if where.is_dir() else []
    if given and not dirs:
        raise InputError(f"--cache-from {where} holds no activation caches (activations*/{MANIFEST}).")
    return dirs


def train_on_data(data_dirs: Sequence[str | Path | DataRef], out_dir: str | Path, cfg: TrainConfig,
                  head_config: HeadConfig | None = None, target_name: str | None = None, teacher_topk: int = 32,
                  cache_dtype: str = "auto", resume: bool = False, max_steps: int | None = None,
                  init_head: str | Path | None = None, progress: bool = True, online: bool = False,
                  device: str | torch.device = "cpu", cache_from: str | Path | None = None) -> dict[str, Any] | None:
    """`mtpspec train` end to end: cache the target's activations on each data set, then `train`.

    data_dirs: data directories, or `DataRef`s / `DIR:N` strings for the first N shards of one.

    1. Check every data directory before loading any model, so a typo fails in a second.
    2. Rank 0 alone runs the target (in `cache_dtype`) once over each data set into
       out_dir/activations, activations-1, ... (resumable); under torchrun the other ranks wait
       at a barrier, then all read the same caches.
    3. Every rank trains on an fp32 copy of the target (frozen; only its modules are shared).

    online: no activation cache on disk; each rank's target (in `cache_dtype`) computes a sample's
    activations when training reads it (`activations.online_samples`): the same values, so the
    same steps, for one target forward per sample per epoch. For data whose cache would not fit
    the disk (~2 KB per token). Whatever a set already has cached (`out_dir/activations*`, or
    `cache_from`'s: a run folder whose caches were computed for the same target and settings) is
    read from there, the same values, and only the rest is computed: a run on data too big for the
    disk continues from the cache of a smaller run at the cost of its new samples only.

    device: where the target and the head compute (`devices.resolve_device`: cpu, cuda, cuda:N,
    auto); under torchrun with cuda each rank takes the GPU of its LOCAL_RANK. On a GPU,
    cache_dtype auto is bf16.

    Returns `train`'s result on rank 0 and None on the others, so that one process reports.
    """
    dev = resolve_device(device)  # a GPU asked for where there is none fails here, before any data is read
    if cache_dtype == "auto" and dev.type == "cuda":
        cache_dtype = "bf16"
    if not data_dirs:
        raise InputError("Give at least one data directory (written by `mtpspec data`).")
    refs = [DataRef.parse(d) for d in data_dirs]
    sizes = [len(r.samples()) for r in refs]  # reads the token shards: a bad path or N fails here, in seconds
    out = Path(out_dir)
    found = _cache_dirs(out if cache_from is None else Path(cache_from), given=cache_from is not None, online=online)
    # continuing a saved head: its architecture decides what the activation cache holds
    hc = load_head_config(init_head) if init_head is not None else (head_config or HeadConfig())
    rank, world = init_distributed(dev)
    caches: list[str | Path | Samples]
    if online:
        cache_target = Target(load_target(target_name, cache_dtype).model.to(dev))  # kept: it computes each sample when read
        check_draft_model_init(cache_target.config, cfg)
        caches = [online_samples(cache_target, r, hc.hidden_layers, hc.kv_layer, teacher_topk, caches=found)
                  for r in refs]
        for r, c in zip(refs, caches):
            if progress and (n := sum(isinstance(src, Shard) for src, _ in c.refs)):
                tqdm.write(f"{r}: {n} of {len(c)} samples' activations read from its cache, the rest computed when read",
                           file=sys.stderr)
    else:
        cache_dirs = [out / ("activations" if i == 0 else f"activations-{i}") for i in range(len(data_dirs))]
        if rank == 0:
            cache_target = Target(load_target(target_name, cache_dtype).model.to(dev))
            check_draft_model_init(cache_target.config, cfg)
            with tqdm(total=sum(cache_shards(n) for n in sizes), desc="caching target activations", unit="shard",
                      disable=not progress) as bar:  # one bar, one remaining time, for every set
                for ref, cache_dir in zip(refs, cache_dirs):
                    build_cache(cache_target, ref, cache_dir, hc.hidden_layers, hc.kv_layer, teacher_topk, bar=bar)
            del cache_target
        if world > 1:
            dist.barrier()
        caches = [load_cache(d, n) for d, n in zip(cache_dirs, sizes)]
    target = Target(load_target(target_name, "fp32").model.to(dev))
    result = train(target, caches, out, cfg, hc, resume=resume, max_steps=max_steps, progress=progress,
                   init_head=init_head, device=dev)
    return result if rank == 0 else None
