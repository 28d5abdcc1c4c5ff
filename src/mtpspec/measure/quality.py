"""What a decoded text is worth, measured rather than assumed: the price of relaxed acceptance.

Three figures per output, each a plain function:
- `mean_logprob`: the target's own mean log-probability (nats per token) of the text it emitted,
  from one teacher-forced forward over prompt + output. Exact greedy output is the target's
  likeliest path token by token, so a relaxed rule can only keep it or lower it locally.
- `edit_distance`: tokens inserted, deleted or substituted to turn one output into another
  (against plain decoding's output, k0, in the bench).
- `reference_score`: against a reference answer, where the prompt set has one (Spec-Bench):
  ROUGE-L F1 for summarization (rouge-score), chrF for translation (sacrebleu), the final
  number for math_reasoning (GSM8K's "#### N"), and whether any reference answer appears in the
  output for rag. On a 0-100 scale. rouge-score and sacrebleu are the `quality` extra.

Letters: T prompt tokens, n output tokens, V vocabulary."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.target import Target
from ..errors import MtpspecError
from ..prompts import Prompt

# category -> the reference metric it is scored with
REFERENCE_METRICS = {"summarization": "rougeL", "translation": "chrF", "math_reasoning": "answer", "rag": "contains"}
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@torch.no_grad()
def mean_logprob(target: Target, prompt_ids: torch.Tensor, tokens: Sequence[int]) -> float | None:
    """The target's mean log p(token | everything before it) over `tokens`, the text it emitted
    after `prompt_ids` (1, T), in nats per token (None for an empty output). One forward over
    the prompt and the output, the logits kept for the output's rows only."""
    n = len(tokens)
    if n == 0:
        return None
    ids = torch.cat([prompt_ids.to(target.device), prompt_ids.new_tensor([list(tokens)]).to(target.device)], 1)  # (1, T + n)
    out = target.forward(ids[:, :-1], target.new_cache(ids.shape[1]), logits_to_keep=n)
    logp = out.logits[0].float().log_softmax(-1)  # (n, V): row i predicts tokens[i]
    return float(logp[torch.arange(n), torch.tensor(list(tokens))].mean())


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token sequences (unit costs)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def _reference_text(reference: Any) -> str | None:
    """The first reference answer as text (Spec-Bench keeps a list, one per turn)."""
    while isinstance(reference, list) and reference:
        reference = reference[0]
    return reference if isinstance(reference, str) and reference.strip() else None


def rouge_l(text: str, reference: str) -> float:
    """ROUGE-L F1 (Lin 2004) with rouge-score's tokenizer and Porter stemmer, 0-100."""
    try:
        from rouge_score import rouge_scorer
    except ImportError as e:
        raise MtpspecError("ROUGE-L needs rouge-score: pip install 'mtpspec[quality]'") from e
    return 100.0 * rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(reference, text)["rougeL"].fmeasure


def chrf(text: str, reference: str) -> float:
    """Sentence chrF (Popovic 2015) as sacrebleu computes it, 0-100."""
    try:
        import sacrebleu
    except ImportError as e:
        raise MtpspecError("chrF needs sacrebleu: pip install 'mtpspec[quality]'") from e
    return float(sacrebleu.sentence_chrf(text, [reference]).score)


def final_number(text: str) -> float | None:
    """The answer a math text gives: the number after GSM8K's '####' if there is one, else the
    last number in the text (thousands separators dropped)."""
    marked = "####" in text
    found = NUMBER.findall(text.rsplit("####", 1)[1] if marked else text)
    if not found:
        return None
    try:
        return float(found[0 if marked else -1].replace(",", ""))
    except ValueError:
        return None


def answer_match(text: str, reference: str) -> float:
    """100 when the output's final number equals the reference's, else 0."""
    want, got = final_number(reference), final_number(text)
    return 100.0 if want is not None and got is not None and abs(want - got) < 1e-6 else 0.0


def contains_answer(text: str, reference: Any) -> float:
    """100 when any reference answer appears in the output (case and spacing ignored), else 0."""
    answers = reference[0] if isinstance(reference, list) and reference and isinstance(reference[0], list) else reference
    answers = [answers] if isinstance(answers, str) else list(answers or [])

    def norm(s: str) -> str:
        return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())

    out = norm(text)
    return 100.0 if any(norm(a) and norm(a) in out for a in answers if isinstance(a, str)) else 0.0


def reference_score(category: str, text: str, reference: Any) -> tuple[str, float] | None:
    """(metric, score 0-100) of `text` against `reference` for a category scored on references;
    None when the category has no metric here or the prompt no reference."""
    metric = REFERENCE_METRICS.get(category)
    if metric is None or reference is None:
        return None
    if metric == "contains":
        return metric, contains_answer(text, reference)
    ref = _reference_text(reference)
    if ref is None:
        return None
    score = {"rougeL": rouge_l, "chrF": chrf, "answer": answer_match}[metric](text, ref)
    return metric, score


def missing_libraries() -> list[str]:
    """The `quality` extra's libraries that are not installed (the reference metrics need them)."""
    import importlib.util

    return [name for name, module in (("rouge-score", "rouge_score"), ("sacrebleu", "sacrebleu"))
            if importlib.util.find_spec(module) is None]


@dataclass
class QualityScorer:
    """Scores a bench output: the target's mean log-probability of it and, where the prompt has
    a reference, the category's reference metric. An output already scored (another method
    decoded the same tokens) is not run through the target again."""

    target: Target
    decode: Callable[[list[int]], str]  # token ids -> text (the tokenizer's, special tokens skipped)
    references: bool = True  # score against references (False: the log-probability only)
    _seen: dict[tuple[Any, tuple[int, ...]], dict[str, float]] = field(default_factory=dict, repr=False)

    def __call__(self, prompt: Prompt, prompt_ids: torch.Tensor, tokens: list[int]) -> dict[str, float]:
        key = (prompt.question_id, tuple(tokens))
        if key not in self._seen:
            scores: dict[str, float] = {}
            lp = mean_logprob(self.target, prompt_ids, tokens)
            if lp is not None:
                scores["logprob"] = lp
            ref = reference_score(prompt.category, self.decode(tokens), prompt.reference) if self.references else None
            if ref is not None:
                scores[ref[0]] = ref[1]
            self._seen[key] = scores
        return dict(self._seen[key])
