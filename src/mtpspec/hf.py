"""Keep `model.generate`: a `custom_generate` callable that decodes with an MTP head.

    fn = mtpspec.hf.custom_generate(head)
    out = model.generate(**inputs, custom_generate=fn, max_new_tokens=64)

transformers prepares the generation config, the stopping criteria and the logits processors,
then calls `fn(model, input_ids, logits_processor=..., stopping_criteria=...,
generation_config=..., **model_kwargs)`; `fn` runs `mtpspec.generate` (the one decode loop)
and returns what `generate` would: the prompt followed by the new tokens. Greedy output is
the same as plain `model.generate` in fp32; sampling (do_sample with temperature, top_k,
top_p) keeps the target's exact distribution. Settings that mtpspec cannot honour exactly
(repetition penalty, custom stopping criteria, ...) are refused, not ignored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .config import SamplingConfig
from .core.decode import generate
from .core.head import MTPHead
from .errors import InputError

# What transformers builds from generation settings that mtpspec reproduces itself.
_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
_STOPPERS = {"MaxLengthCriteria", "EosTokenCriteria"}


def custom_generate(head: MTPHead, num_draft_tokens: int | None = None, streamer: Any = None) -> Callable[..., Any]:
    """A callable for `model.generate(..., custom_generate=fn)` that drafts with `head`.

    `num_draft_tokens`: drafts per round (None: the head's tuned k). `streamer`: a
    transformers streamer (`put` / `end`), given here because transformers does not pass
    `generate(streamer=...)` on to a custom_generate callable (as of 5.24 it only puts the
    prompt into it)."""
    if not isinstance(head, MTPHead):
        raise InputError(f"custom_generate needs an MTPHead, got {type(head).__name__}.")
    from .pretrained import default_k

    k = default_k(head) if num_draft_tokens is None else num_draft_tokens

    def mtpspec_generate(model: Any, input_ids: torch.Tensor, logits_processor: Any = None, stopping_criteria: Any = None,
                         generation_config: Any = None, **model_kwargs: Any) -> Any:
        if head.target.hf_model is not model:
            raise InputError("This head was loaded for another model object: load it with "
                             "MTPHead.from_pretrained(dir, model) for the model you call generate on.")
        _refuse_unsupported(logits_processor, _PROCESSORS, "generation settings")
        _refuse_unsupported(stopping_criteria, _STOPPERS, "stopping criteria")
        mask = model_kwargs.get("attention_mask")
        if mask is not None and not bool((mask == 1).all()):
            raise InputError("custom_generate decodes one unpadded sequence: the attention mask must be all ones.")
        gc = generation_config
        sampling = (SamplingConfig(temperature=gc.temperature, top_k=gc.top_k, top_p=gc.top_p) if gc.do_sample
                    else SamplingConfig())
        # Seed mtpspec's generator from torch's global one, so torch.manual_seed makes sampling
        # reproducible, as it does for plain generate.
        seed = int(torch.randint(0, 2**62, (1,))) if gc.do_sample else None
        if streamer is not None:
            streamer.put(input_ids.cpu())
        drafter: Any = head  # an MTPHead is a Drafter (mypy reads its hidden_layers property as read-only)
        out = generate(head.target, drafter, input_ids, max_new_tokens=gc.max_length - input_ids.shape[1],
                       num_draft_tokens=k, eos_token_id=gc.eos_token_id if gc.eos_token_id is not None else [],
                       temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=seed,
                       on_tokens=(lambda new: streamer.put(torch.tensor(new))) if streamer is not None else None)
        if streamer is not None:
            streamer.end()
        if gc.return_dict_in_generate:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            return GenerateDecoderOnlyOutput(sequences=out.sequences)  # type: ignore[arg-type]
        return out.sequences

    return mtpspec_generate


def _refuse_unsupported(items: Any, allowed: set[str], what: str) -> None:
    names = sorted({type(x).__name__ for x in items or []} - allowed)
    if names:
        raise InputError(f"mtpspec's custom_generate cannot apply these {what} exactly: {', '.join(names)}. It supports "
                         "max_new_tokens, eos_token_id and do_sample with temperature / top_k / top_p; drop the others "
                         "or call generate without custom_generate.")
