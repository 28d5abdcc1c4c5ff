"""The one decode loop: draft -> verify -> accept -> roll back.

Letters: T prompt length, K drafts per round, V vocabulary, F head features.

Invariant at the top of every round: the target's cache holds positions 0..L-1, `hidden` is
the target's features at L-1, and `tokens[-1]` (position L) is the target's own choice for the
next token, already emitted but not yet run through the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import SamplingConfig
from .draft import Drafter, DraftInput
from ..errors import InputError
from .sampling import make_generator, probs_from_logits, sample
from .stats import DecodeStats
from .target import Target
from .verify import accept_greedy, accept_speculative


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # (1, T + n): prompt then new tokens, as HF generate returns
    stats: DecodeStats


def resolve_eos(target: Target, eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        gc = getattr(target.model, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return {int(i) for i in ids}


@torch.no_grad()
def generate(
    target: Any,
    drafter: Drafter | None,
    input_ids: torch.Tensor,
    max_new_tokens: int = 128,
    num_draft_tokens: int = 4,
    eos_token_id: int | Sequence[int] | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerateOutput:
    """Decode with the target, drafting `num_draft_tokens` per round with `drafter`.

    Greedy (temperature 0) output equals `target.generate(do_sample=False)` token for token;
    sampled output is distributed exactly as the target's with the same settings.
    `num_draft_tokens=0` (or `drafter=None`) is plain autoregressive decoding in the same loop.
    `on_tokens` is called with each round's newly accepted token ids (for streaming).
    """
    t = target if isinstance(target, Target) else Target(target)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    input_ids = _check_input(input_ids, t)
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    if num_draft_tokens < 0:
        raise InputError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}.")
    k_max = num_draft_tokens if drafter is not None else 0
    hidden_layers = getattr(getattr(drafter, "config", None), "hidden_layers", (-1,))
    eos = resolve_eos(t, eos_token_id)
    gen = make_generator(sampling, t.device)
    stats = DecodeStats.empty(k_max)

    def pick(logits: torch.Tensor) -> int:  # (V,) -> the target's own token
        if sampling.greedy:
            return int(logits.argmax())
        return int(sample(probs_from_logits(logits[None], sampling), gen))

    # 0. Prefill: the whole prompt once; only the last position's logits are needed.
    t0 = time.perf_counter()
    cache = t.new_cache()
    out = t.forward(input_ids, cache, hidden_layers, logits_to_keep=1)
    hidden = out.hidden[:, -1]  # (1, F)
    new = [pick(out.logits[0, -1])]
    stats.prefill_s = time.perf_counter() - t0
    stats.target_forwards = 1
    if on_tokens:
        on_tokens(new[:])
    tokens = torch.cat([input_ids, input_ids.new_tensor([new])], dim=1)  # (1, L + 1)

    while new[-1] not in eos and len(new) < max_new_tokens:
        # Never draft past max_new_tokens: the round always adds the target's own token too.
        k = min(k_max, max_new_tokens - len(new) - 1)

        # 1. Draft k tokens (the drafter reads the cache, never writes it).
        t0 = time.perf_counter()
        if k:
            draft = drafter.propose(DraftInput(tokens=tokens, hidden=hidden, cache=cache), k, sampling, gen)  # type: ignore[union-attr]
            drafts = draft.tokens.to(tokens.device)  # (K,)
            if drafts.shape != (k,):  # a wrong count would make the rollback drop the wrong positions
                raise InputError(f"{type(drafter).__name__}.propose returned {tuple(drafts.shape)} tokens, expected ({k},).")
        else:
            draft, drafts = None, tokens.new_empty(0)
        t1 = time.perf_counter()

        # 2. Verify: one target forward over the last token and the k drafts.
        step = t.forward(torch.cat([tokens[:, -1:], drafts[None]], dim=1), cache, hidden_layers)
        logits = step.logits[0]  # (K + 1, V)

        # 3. Accept the longest agreeing prefix plus the target's own next token.
        if sampling.greedy:
            n, nxt = accept_greedy(drafts, logits)
        else:
            p = probs_from_logits(logits, sampling)  # (K + 1, V)
            if draft is None:
                q = p.new_zeros(0, p.shape[1])
            elif draft.q is None:
                raise InputError(f"{type(drafter).__name__} returned no q: sampling needs the draft distribution.")
            else:
                q = draft.q.to(p)
            n, nxt = accept_speculative(drafts, q, p, gen)

        # 4. Roll the cache back past the rejected drafts; 5. continue from the hidden state of
        # the last accepted position, which this verify pass already computed.
        Target.rollback(cache, k - n)
        hidden = step.hidden[:, n]  # (1, F)
        accepted = drafts[:n].tolist() + [nxt]
        stats.verify_s += time.perf_counter() - t1
        stats.draft_s += t1 - t0
        stats.target_forwards += 1
        stats.record_round(k, n)

        # Stop at the first EOS and at max_new_tokens, even inside an accepted run.
        for j, tok in enumerate(accepted):
            if tok in eos:
                accepted = accepted[: j + 1]
                break
        accepted = accepted[: max_new_tokens - len(new)]
        new.extend(accepted)
        tokens = torch.cat([tokens, tokens.new_tensor([accepted])], dim=1)
        if on_tokens:
            on_tokens(accepted)

    stats.new_tokens = len(new)
    return GenerateOutput(sequences=tokens, stats=stats)


def _check_input(input_ids: Any, t: Target) -> torch.Tensor:
    if not torch.is_tensor(input_ids) or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise InputError("input_ids must be an integer torch tensor of shape (1, T).")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise InputError(f"input_ids must have shape (1, T) with T >= 1, got {tuple(input_ids.shape)}.")
    if input_ids.shape[0] != 1:
        raise InputError(
            f"mtpspec decodes one sequence at a time (batch size 1); got batch size {input_ids.shape[0]}. "
            "Call generate once per prompt."
        )
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= t.vocab_size:
        raise InputError(f"input_ids hold ids outside the target's vocabulary [0, {t.vocab_size}).")
    return input_ids.long().to(t.device)
