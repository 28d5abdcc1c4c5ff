"""An independent draft model in mtpspec's own loop: the baseline the MTP head is measured
against (issue 47).

Letters: L + 1 tokens of text so far (`DraftInput.tokens`), C tokens whose keys and values the
draft model's cache holds, K drafts, V vocabulary.

A draft model is a standalone small causal LM with its own embedding table, LM head and KV
cache (e.g. `mtpspec train --kind draft-model`). It runs through the same `Target` adapter as
the target: its own decoder stack over its own `KVCache`, the fused forward where the
model, dtype and CPU allow, as the head's draft step is fused where the target's forward is.
`decode.step` verifies its chain exactly as it verifies the head's, so the two methods differ
in the drafter alone.

Its cache follows the text: a round feeds the tokens it has not yet seen (the whole prompt in
the first round, unless `prefill` ran), then one token per draft step; `update` rolls it back
to the accepted drafts, as the target's cache is rolled back, so it always holds a prefix of
the text: the keys and values a fresh prefill of that prefix computes (tests/test_draft_model.py).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..config import SamplingConfig
from ..errors import InputError
from .cache import KVCache
from .draft import Draft, DraftInput
from .sampling import probs_from_logits, sample
from .target import Target


def check_vocab(draft_model: Target, target: Target) -> None:
    """A draft model proposes token ids the target verifies: they must share the vocabulary."""
    if draft_model.vocab_size != target.vocab_size:
        raise InputError(f"The draft model's vocabulary ({draft_model.vocab_size} tokens) differs from the target's "
                         f"({target.vocab_size}): a draft model must share the target's tokenizer. Train one for this "
                         "target with `mtpspec train --kind draft-model`.")


class DraftModelDrafter:
    """Chains of k tokens from a standalone draft model, greedy or sampled (with q, so that
    speculative sampling stays exact)."""

    hidden_layers = (-1,)  # it reads no target features; the loop's default ones go unused

    def __init__(self, model: PreTrainedModel | Target, target: Target):
        self.lm = model if isinstance(model, Target) else Target(model)
        check_vocab(self.lm, target)
        self.cache: KVCache = self.lm.new_cache()  # growable: the drafter is not told the request's length
        self.ids: list[int] = []  # the C tokens whose keys and values `cache` holds, in order

    def prefill(self, input_ids: torch.Tensor) -> None:
        """Read a new prompt (1, T) now rather than in the first round: for a caller that wants
        the draft model's prefill before the target's first token (the bench's TTFT counts it)."""
        self._advance(input_ids[0].tolist())

    def _advance(self, text: list[int]) -> torch.Tensor:
        """Bring the cache to all of `text` in one forward; returns the logits after its last
        token (V,). Within a request the cache is always a prefix of the text (`update` trims it
        to the accepted drafts); anything else is a new request, prefilled from scratch."""
        C = len(self.ids)
        if self.ids != text[:C]:
            C = 0
        C = min(C, len(text) - 1)  # the last token always runs: its logits draft the first token
        self.cache.truncate(C)
        new = torch.tensor([text[C:]], dtype=torch.long, device=self.lm.device)  # (1, T)
        out = self.lm.forward(new, self.cache, logits_to_keep=1)
        self.ids = list(text)
        return out.logits[0, -1]

    @torch.no_grad()
    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        """Feed the text's unseen tokens, then draft k tokens, one forward per draft after the
        first (the last draft is not fed: the round's verify decides whether it stays)."""
        logits = self._advance(inp.tokens[0].tolist())  # (V,)
        drafted, qs = [], []
        for j in range(k):
            if j:
                out = self.lm.forward(torch.tensor([drafted[-1:]], device=self.lm.device), self.cache, logits_to_keep=1)
                self.ids.append(drafted[-1])
                logits = out.logits[0, -1]
            if sampling.greedy:
                drafted.append(int(logits.argmax()))
            else:
                q = probs_from_logits(logits[None], sampling)  # (1, V), made as the target's p is
                drafted.append(int(sample(q, generator)))
                qs.append(q)
        return Draft(tokens=torch.tensor(drafted, dtype=torch.long), q=torch.cat(qs) if qs else None)

    def update(self, drafted: int, accepted: int) -> None:
        """Roll the cache back with the target's: of the drafted - 1 drafts it was fed, keep the
        accepted ones."""
        fed = drafted - 1
        keep = len(self.ids) - fed + min(accepted, fed)
        self.cache.truncate(keep)
        del self.ids[keep:]
