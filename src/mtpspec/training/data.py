"""Self-distillation data: the frozen target writes the prompts and the answers.

The head must learn what the *target* would say, so the training text is the target's own
output. Two recipes:

- `chat` (instruct models): the target writes its own user turns (the Magpie idea: run the
  chat template up to the user's text and let the model continue), seeded with openers for
  the on-device workloads (`tasks.TASK_OPENERS`), and answers them. A share of each batch
  follows the two-stage document recipe: the target writes a passage (an article, email,
  chat thread, notes, notifications, code), then answers a request over it (summarise,
  answer, extract, rewrite, proofread a copy with typos, translate, reply, complete the
  code). A share of answered chats gets a follow-up user turn (multi-turn). With real passages
  (`--passages`: documentation, articles, code files on disk) a share of the document seeds
  skips stage 1 and asks over a real passage instead: a 135M target's own passages are short,
  generic and loop, unlike the documents users bring. The answers are still the target's.
- `continuation` (base models, no chat template): prefixes from a corpus, a prompts file, or
  the target's own sampled text, continued greedily by the target.

Every answer becomes one sample (prompt ids, answer ids). Batches are the unit of work and of
resumption: each writes one compressed shard (see `shards.py`) and the manifest records the
prompts consumed; the prompt stream and each batch's sampling are seeded from the run's seed
and the batch's place in the stream, so a killed run resumes as if never stopped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessorList

from ..core import fused
from ..core.batch import AMX_DRAFT_ROWS, BATCH_ROWS_MAX, BatchConfig
from ..core.drafters import default_k
from ..core.target import Target
from ..errors import DataError, InputError
from .batch_generate import GENERATION, PREFIX_KEEP, Job, RowPool, batch_generate
from .everyday import everyday_request
from .fast_generate import NucleusSampler, attention_implementation, generation, length_buckets
from .shards import read_manifest, save_manifest, shard_path, write_shard
from .tasks import DOCUMENT_OPENERS, FOLLOW_UPS, TASK_OPENERS, is_repetitive, request_over

RECIPES = ("auto", "chat", "continuation")
TOP_P = 0.95  # nucleus of the sampled stages (self-written prompts and passages)
# Openers of the target's own text for the continuation recipe ("" = from the BOS token alone).
CONTINUATION_OPENERS = ["", "The", "In", "A", "I", "When", "def ", "import ", "# ", "Dear", "Q:", "1."]


@dataclass(frozen=True)
class DataConfig:
    # Samples (one per answer) to write in total; the last batch is written whole, so a run
    # may end a little past it (cutting a batch would make a resumed run differ from one run).
    num_samples: int = 2000
    # Seeds per batch, each batch one shard. HF engine: each stage of a batch is one batched generate;
    # batch engine: up to PIPELINE_DEPTH batches in flight, their rows sharing forwards.
    batch_size: int = 64
    # chat | continuation | auto (chat when the tokenizer has a chat template, else continuation).
    recipe: str = "auto"
    # Longest self-written user turn (continuation: self-written prefix), in tokens.
    max_prompt_tokens: int = 96
    # Longest answer, in tokens.
    max_response_tokens: int = 192
    # Longest passage the document recipe has the target write.
    max_document_tokens: int = 320
    # Temperature of the self-written prompts and passages' topics (they must vary).
    prompt_temperature: float = 1.0
    # Temperature of the answers: 0 = greedy, what greedy decoding will verify against.
    response_temperature: float = 0.0
    # Share of short user turns that start from a task opener (the rest: free Magpie turns).
    task_share: float = 0.8
    # Share of seeds that follow the two-stage document recipe.
    document_share: float = 0.5
    # Share of answered chats that get a second user turn.
    follow_up_share: float = 0.25
    # With real passages: share of the document seeds that ask over a real passage instead of
    # one the target writes.
    passage_share: float = 0.75
    # Share of seeds that are everyday requests assembled from templates (`everyday.py`:
    # notifications, chats and emails with names, times and places; replies, rewrites, short
    # questions, code stubs) instead of turns the target writes. 0 keeps the older recipe.
    everyday_share: float = 0.0
    # Keep only user turns the target finished itself (ended with a stop token).
    require_finished_prompts: bool = True
    # Seed of the prompt stream and of each batch's sampling; a resume replays it exactly.
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size", "max_prompt_tokens", "max_response_tokens", "max_document_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"DataConfig.{name} must be >= 1.")
        for name in ("task_share", "document_share", "follow_up_share", "passage_share", "everyday_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InputError(f"DataConfig.{name} must be in [0, 1].")
        if self.recipe not in RECIPES:
            raise InputError(f"DataConfig.recipe must be one of {', '.join(RECIPES)}; got {self.recipe!r}.")


def read_prompts_file(path: str | Path) -> list[str]:
    """Prompts from a .jsonl (fields prompt / turns[0] / text / instruction) or a .txt file."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Prompts file {p} does not exist.")
    out: list[str] = []
    if p.suffix == ".jsonl":
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{n} is not valid JSON: {e}") from None
            text = obj.get("prompt") or (obj.get("turns") or [None])[0] or obj.get("text") or obj.get("instruction")
            if not isinstance(text, str):
                raise DataError(f"{p}:{n} has no 'prompt', 'turns', 'text' or 'instruction' string.")
            out.append(text)
    else:
        out = [line.strip() for line in p.read_text().splitlines() if line.strip()]
    if not out:
        raise DataError(f"Prompts file {p} holds no prompts.")
    return out


def corpus_chunks(path: str | Path, chunk_chars: int = 600) -> list[str]:
    """A raw-text corpus cut into chunks: prefixes to continue (the chat recipe wraps each in a
    'continue this text' request)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Corpus file {p} does not exist.")
    text = p.read_text(errors="replace")
    chunks = [text[i:i + chunk_chars].strip() for i in range(0, len(text), chunk_chars)]
    out = [c for c in chunks if len(c) > 40]
    if not out:
        raise DataError(f"Corpus file {p} holds no usable text.")
    return out


# Files read as real passages, by kind: code (requests to complete, explain, test it) or prose.
CODE_SUFFIXES = {".py", ".js", ".ts", ".c", ".h", ".cc", ".cpp", ".go", ".rs", ".java", ".sh", ".rb"}
PROSE_SUFFIXES = {".txt", ".md", ".rst"}


def passage_chunks(paths: str | Path | list[str] | list[Path], max_chars: int = 1600,
                   min_chars: int = 300) -> list[tuple[str, str]]:
    """Real passages as (kind, text): every text file under `paths` (files or directories, read
    in sorted order, so the list is the same on every machine with the same files), cut at blank
    lines into pieces of `min_chars`..`max_chars` (a single paragraph longer than `max_chars` is
    cut there, its rest dropped). kind is 'code' for source files, else 'article'."""
    roots = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    files: list[Path] = []
    for p in roots:
        if not p.exists():
            raise DataError(f"Passages path {p} does not exist.")
        files += [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    # '.rst.txt' (Sphinx sources) counts by its last suffix
    files = [f for f in files if f.suffix in CODE_SUFFIXES | PROSE_SUFFIXES]
    out: list[tuple[str, str]] = []
    for f in files:
        kind = "code" if f.suffix in CODE_SUFFIXES else "article"
        piece = ""
        for para in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            if len(piece) + len(para) > max_chars and len(piece) >= min_chars:
                out.append((kind, piece.strip()))
                piece = ""
            piece = f"{piece}\n\n{para}" if piece else para
            if len(piece) > max_chars:  # one huge paragraph: cut it
                out.append((kind, piece[:max_chars].strip()))
                piece = ""
        if len(piece) >= min_chars:
            out.append((kind, piece.strip()))
    if not out:
        raise DataError(f"No passages of >= {min_chars} characters in {', '.join(map(str, roots))} (text files read: "
                        f"{', '.join(sorted(CODE_SUFFIXES | PROSE_SUFFIXES))}).")
    return out


def is_degenerate(ids: list[int], min_tokens: int = 4) -> bool:
    """Too short, or dominated by one repeated token or a looping 4-gram."""
    if len(ids) < min_tokens:
        return True
    if max(ids.count(t) for t in set(ids)) > 0.5 * len(ids) and len(ids) > 8:
        return True
    grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
    return len(grams) > 16 and len(set(grams)) < 0.3 * len(grams)


class _Budget:
    """Counts response tokens across a run, for the progress bar's throughput."""

    def __init__(self) -> None:
        self.tokens = 0
        self.t0 = time.perf_counter()

    def rate(self) -> float:
        return self.tokens / max(1e-9, time.perf_counter() - self.t0)


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Ids that end a turn: the tokenizer's EOS, the model's generation EOS, and <|im_end|> if
    the vocabulary has it."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    ids.add(tokenizer.get_vocab().get("<|im_end|>"))
    return sorted(i for i in ids if i is not None)


def _chat_prefix(tokenizer: Any, opener: str) -> str:
    """The chat template up to (and including) the start of the user's text."""
    marker = "\x00MTPSPEC\x00"
    full = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=False)
    return full[: full.index(marker)] + opener


class _Writer:
    """Batched generation over token-id rows, for one data run (model, tokenizer, stop ids)."""

    def __init__(self, model: Any, tokenizer: Any, cfg: DataConfig, stop_ids: list[int], fast: bool = True,
                 buckets: bool = True):
        self.model, self.tok, self.cfg, self.stop_ids = model, tokenizer, cfg, stop_ids
        self.fast = fast  # sample with `NucleusSampler` (else HF's own top-p)
        self.buckets = buckets  # one generate call per length bucket (`length_buckets`), else one per batch
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else stop_ids[0]

    def ids(self, text: str, special: bool = False) -> list[int]:
        return self.tok(text, add_special_tokens=special)["input_ids"]

    def text(self, ids: list[int]) -> str:
        return self.tok.decode([t for t in ids if t not in self.stop_ids], skip_special_tokens=True)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.ids(self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def finished(self, ids: list[int]) -> bool:
        return bool(ids) and ids[-1] in self.stop_ids

    def batches(self, start: Callable[[int], tuple[int, Stages] | None]) -> Iterator[tuple[list[Sample], list[str]]]:
        """Each batch's (samples, added prompt hashes), in stream order, one batch at a time, its
        generations one after another. `start(n)` gives the next batch (its seed, its stages)
        while n batches are in flight, or None to stop. HF's sampling draws from torch's global
        generator, seeded per batch, so that a resumed run writes what one run writes."""
        while (b := start(0)) is not None:
            seed, stages = b
            torch.manual_seed(seed)
            yield _run(stages, lambda gens: [self.generate(*g) for g in gens])

    def generate(self, rows: list[list[int]], max_new: int, temperature: float) -> list[list[int]]:
        """Batched HF generate, one call per length bucket -> each row's new ids, in row order."""
        if not self.buckets:
            return self._generate(rows, max_new, temperature)
        new: list[list[int]] = [[] for _ in rows]
        for bucket in length_buckets([len(r) for r in rows], max_new):
            for i, ids in zip(bucket, self._generate([rows[i] for i in bucket], max_new, temperature)):
                new[i] = ids
        return new

    def _generate(self, rows: list[list[int]], max_new: int, temperature: float) -> list[list[int]]:
        """Left-padded batched HF generate -> each row's new ids, cut after the first stop id."""
        if not rows:
            return []
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        kw: dict[str, Any] = {"do_sample": temperature > 0 and not self.fast}
        if temperature > 0 and self.fast:
            kw["logits_processor"] = LogitsProcessorList([NucleusSampler(temperature, TOP_P)])
        elif temperature > 0:
            kw.update(temperature=temperature, top_p=TOP_P, top_k=0)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                      eos_token_id=self.stop_ids, pad_token_id=self.pad_id, **kw)
        new = []
        for r in out[:, width:].tolist():
            cut = next((i for i, t in enumerate(r) if t in self.stop_ids), None)
            new.append(r if cut is None else r[: cut + 1])
        return new


# Data batches the batched writer keeps in flight: while one waits for its slowest rows, the next
# ones' rows fill the forward (`RowPool`).
PIPELINE_DEPTH = 3


class _BatchWriter(_Writer):
    """Generation through mtpspec's own batched decode loop (`batch_generate.py`): the same
    prompts, stages and cuts, each row mtpspec's plain decoding of it, several data batches in
    flight at once through one `RowPool`."""

    def __init__(self, target: Target, tokenizer: Any, cfg: DataConfig, stop_ids: list[int], head: Any = None,
                 amx: bool = False, depth: int | None = None):
        super().__init__(target.hf_model, tokenizer, cfg, stop_ids)
        self.target, self.depth = target, depth or PIPELINE_DEPTH
        self.head, self.k = head, (default_k(head) if head is not None else 0)
        # blocks on AMX tiles: rows cost little, so the greedy rows left at a stage's end draft more
        # (drafts never change a greedy row, and sampled rows are not drafted: the same set)
        # and prompts that begin as an earlier row did (the chat template, a task's instructions, a
        # follow-up's conversation so far) copy that row's keys and values (exact: the same set)
        self.config = BatchConfig(max_rows=BATCH_ROWS_MAX, prefix_keep=PREFIX_KEEP,
                                  **({"draft_rows": AMX_DRAFT_ROWS} if amx else {}))

    def generate(self, rows: list[list[int]], max_new: int, temperature: float) -> list[list[int]]:
        """One generation alone through mtpspec's loop, its seeds from torch's global generator."""
        return batch_generate(self.target, rows, max_new, temperature, TOP_P, self.stop_ids, self.head, self.k,
                              self.config)

    def batches(self, start: Callable[[int], tuple[int, Stages] | None]) -> Iterator[tuple[list[Sample], list[str]]]:
        """`_Writer.batches` with up to `depth` batches in flight, their rows in one `RowPool`. What
        each batch writes is what it writes alone: every row is decoded exactly whatever shares its
        forward, each batch draws its rows' seeds from its own generator (seeded as the global one
        is one batch at a time), and the batches are sent their first outputs, the only ones that
        read or add to `seen`, in stream order."""
        pool = RowPool(self.target, TOP_P, self.stop_ids, self.head, self.k, self.config)
        flight: list[_Flight] = []  # in stream order
        while True:
            while len(flight) < self.depth and (b := start(len(flight))) is not None:
                seed, stages = b
                flight.append(_Flight(stages, torch.Generator().manual_seed(seed)))
                flight[-1].submit(pool, next(stages))
            if not flight:
                return
            for n, f in enumerate(flight):  # deliver what is done; first outputs in stream order
                while f.jobs is not None and all(j.done for j in f.jobs) and (f.sent or all(g.sent for g in flight[:n])):
                    f.deliver(pool)
            if flight[0].result is not None:
                yield flight.pop(0).result
            elif pool.busy:
                pool.step()


class _Flight:
    """One data batch in flight: its stages, its generator, the jobs it waits for."""

    def __init__(self, stages: Stages, generator: torch.Generator):
        self.stages, self.generator = stages, generator
        self.jobs: list[Job] | None = None
        self.sent = False  # first outputs delivered
        self.result: tuple[list[Sample], list[str]] | None = None

    def submit(self, pool: RowPool, gens: list[Gen]) -> None:
        self.jobs = [pool.submit(rows, max_new, t, self.generator) for rows, max_new, t in gens]

    def deliver(self, pool: RowPool) -> None:
        outs = [j.out for j in self.jobs or []]
        self.jobs, self.sent = None, True
        try:
            self.submit(pool, self.stages.send(outs))
        except StopIteration as e:
            self.result = e.value


def _run(stages: Stages, run: Callable[[list[Gen]], list[list[list[int]]]]) -> tuple[list[Sample], list[str]]:
    """A batch's stages to the end, each stage's generations through `run`."""
    try:
        gens = next(stages)
        while True:
            gens = stages.send(run(gens))
    except StopIteration as e:
        return e.value


Sample = tuple[list[int], int]  # (prompt + answer ids, prompt length)


# A batch's stages as a generator: it yields the generations it needs next (`Gen`s, run in any
# order or together) and is sent their outputs (each row's new ids), in the same order; it returns
# the batch's samples and the prompt hashes it added to `seen`. Only the first stage's outputs
# touch `seen`, so batches may overlap once each has been sent its first outputs in stream order.
Gen = tuple[list[list[int]], int, float]  # (rows, max_new, temperature)
Stages = Generator[list[Gen], list[list[list[int]]], tuple[list[Sample], list[str]]]


def _answers(w: _Writer, groups: list[list[list[dict[str, str]]]], max_new: list[int]) -> Generator[
        list[Gen], list[list[list[int]]], list[list[tuple[list[dict[str, str]], list[int], list[int]]]]]:
    """Answer each group of chats (one generation each, all at once); keep (messages, prompt ids,
    answer ids) of the non-degenerate answers, per group."""
    prompts = [[w.chat_ids(c) for c in chats] for chats in groups]
    answers = yield [(p, n, w.cfg.response_temperature) for p, n in zip(prompts, max_new)]
    return [[(c, p, a) for c, p, a in zip(chats, ps, ans) if not is_degenerate(a)]
            for chats, ps, ans in zip(groups, prompts, answers)]


def _chat_batch(w: _Writer, batch: list[tuple[str, str]], rng: random.Random, seen: set[str]) -> Stages:
    """One batch of the chat recipe: user turns, answers, requests over passages, follow-ups."""
    cfg = w.cfg
    added: list[str] = []
    # 1. User turns: given prompts as they are; openers continued by the target (sampled).
    magpie = [op for kind, op in batch if kind not in ("given", "everyday") and not kind.startswith("passage:")]
    (got,) = yield [([w.ids(_chat_prefix(w.tok, op)) for op in magpie], cfg.max_prompt_tokens, cfg.prompt_temperature)]
    written = iter(got)
    short: list[list[dict[str, str]]] = []
    docs: list[tuple[str, list[dict[str, str]]]] = []
    real: list[list[dict[str, str]]] = []  # requests over real passages (stage 1 skipped)
    for kind, op in batch:
        if kind.startswith("passage:"):  # one passage may come back with another request
            request = request_over(kind.removeprefix("passage:"), op, rng)
            h = hashlib.sha1(request.encode()).hexdigest()[:16]
            if h not in seen:
                seen.add(h)
                added.append(h)
                real.append([{"role": "user", "content": request}])
            continue
        if kind in ("given", "everyday"):
            user = op
        else:
            ids = next(written)
            ok = not is_degenerate(ids) and (w.finished(ids) or not cfg.require_finished_prompts)
            user = (op + w.text(ids)).strip() if ok else ""
        h = hashlib.sha1(user.encode()).hexdigest()[:16]  # drop empty, too short and repeated turns
        if len(user) < 8 or h in seen:
            continue
        seen.add(h)
        added.append(h)
        chat = [{"role": "user", "content": user}]
        if kind.startswith("document:"):
            docs.append((kind.removeprefix("document:"), chat))
        else:
            short.append(chat)
    # 2. Answers: short turns, and the passages of the document recipe.
    answered, passages = yield from _answers(w, [short, [c for _, c in docs]],
                                             [cfg.max_response_tokens, cfg.max_document_tokens])
    kind_of = {id(c): k for k, c in docs}
    # 3. Requests over the passages (stage 2 of the document recipe).
    requests = [[{"role": "user", "content": request_over(kind_of[id(c)], w.text(a), rng)}]
                for c, _, a in passages if not is_repetitive(w.text(a))]
    answered += (yield from _answers(w, [requests + real], [cfg.max_response_tokens]))[0]
    # 4. Follow-up turns on a share of the answered chats.
    follow = [c + [{"role": "assistant", "content": w.text(a)}, {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
              for c, _, a in answered if rng.random() < cfg.follow_up_share]
    (later,) = yield from _answers(w, [follow], [cfg.max_response_tokens])
    return [(p + a, len(p)) for _, p, a in answered + passages + later], added


def _continuation_batch(w: _Writer, batch: list[tuple[str, str]], seen: set[str]) -> Stages:
    """One batch of the continuation recipe: prefixes (given, or written by the target from an
    opener, sampled), then the target's greedy continuation of each."""
    cfg = w.cfg
    added: list[str] = []
    def start(op: str) -> list[int]:  # with special tokens (BOS); a model without BOS starts after its EOS
        return w.ids(op, special=True) or w.stop_ids[:1]

    openers = [start(op) for kind, op in batch if kind != "given"]
    (got,) = yield [(openers, cfg.max_prompt_tokens, cfg.prompt_temperature)]
    written = iter(got)
    prefixes = []
    for kind, op in batch:
        ids = start(op)
        if kind == "given":
            ids = ids[: cfg.max_prompt_tokens]
        else:
            ids = ids + [t for t in next(written) if t not in w.stop_ids]
        h = hashlib.sha1(str(ids).encode()).hexdigest()[:16]
        if len(ids) >= 4 and h not in seen:
            seen.add(h)
            added.append(h)
            prefixes.append(ids)
    (answers,) = yield [(prefixes, cfg.max_response_tokens, cfg.response_temperature)]
    return [(p + a, len(p)) for p, a in zip(prefixes, answers) if not is_degenerate(a)], added


def _prompt_stream(cfg: DataConfig, recipe: str, extra: list[str],
                   passages: list[tuple[str, str]] | None = None) -> Iterator[tuple[str, str]]:
    """Deterministic stream of (kind, text). Kinds: 'given' (a ready prompt or prefix from a file
    or corpus), 'everyday' (a request assembled from templates, `everyday.py`), 'magpie' (an
    opener the target continues as the user's text), 'document:<kind>' (an opener for a
    passage), 'passage:<kind>' (a real passage to ask about), 'self' (continuation: an opener of
    the target's own text)."""
    rng = random.Random(cfg.seed)
    tasks, doc_kinds = sorted(TASK_OPENERS), sorted(DOCUMENT_OPENERS)
    i = 0
    while True:
        if extra and i % 2 == 1:  # with a prompts file or corpus: every other sample uses it
            yield "given", extra[rng.randrange(len(extra))]
        elif recipe == "continuation":
            yield "self", CONTINUATION_OPENERS[rng.randrange(len(CONTINUATION_OPENERS))]
        elif cfg.everyday_share and rng.random() < cfg.everyday_share:  # no draw at 0: older streams unchanged
            yield "everyday", everyday_request(rng)
        elif rng.random() < cfg.document_share:
            if passages and rng.random() < cfg.passage_share:
                kind, text = passages[rng.randrange(len(passages))]
                yield f"passage:{kind}", text
            else:
                kind = doc_kinds[rng.randrange(len(doc_kinds))]
                yield f"document:{kind}", DOCUMENT_OPENERS[kind][rng.randrange(len(DOCUMENT_OPENERS[kind]))]
        elif rng.random() < cfg.task_share:
            kind = tasks[rng.randrange(len(tasks))]
            yield "magpie", TASK_OPENERS[kind][rng.randrange(len(TASK_OPENERS[kind]))]
        else:
            yield "magpie", ""
        i += 1


def resolve_recipe(recipe: str, tokenizer: Any) -> str:
    """'auto' -> chat with a chat template, continuation without; 'chat' without one is refused."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if recipe == "auto":
        return "chat" if has_template else "continuation"
    if recipe == "chat" and not has_template:
        name = getattr(tokenizer, "name_or_path", "") or "The target's tokenizer"
        raise InputError(f"{name} has no chat template, so the chat recipe cannot write chat turns. Use "
                         "--recipe continuation (or auto) for a base model, or add a chat_template to its "
                         "tokenizer_config.json.")
    return recipe


def generate_data(model: Any, tokenizer: Any, out_dir: str | Path, cfg: DataConfig,
                  prompts_file: str | None = None, corpus: str | None = None, progress: bool = True,
                  passages: list[str] | None = None, engine: str = "hf", head: Any = None) -> dict[str, Any]:
    """Write at least `cfg.num_samples` target-generated samples into out_dir (resumable).

    Everything that can be wrong with the inputs (a recipe the tokenizer cannot serve, a
    missing or malformed prompts file or corpus, out_dir holding other data) is refused before
    out_dir is created, so a failed start leaves nothing behind. The model's dtype is part of
    the settings: bf16 batched generation is several times faster than fp32 on CPUs with
    avx512_bf16, and its rare argmax flips hardly matter for training. Generation runs through
    `fast_generate` (nucleus sampling from the top candidates, grouped decode attention, one
    generate call per length bucket); the manifest records it, and a set started before any of
    these existed is extended as it was written (HF's own generation; one call per batch).
    engine="batch": generation through mtpspec's own batched decode loop instead
    (`batch_generate.py`; greedy answers drafted by `head` if given): each row is mtpspec's plain
    decoding of it, recorded as such; a set keeps the engine it was started with. Its quantized
    matrices run on AMX tiles where the CPU has them (`fused.blocks_on_amx`), set back after."""
    check_engine(engine)
    out = Path(out_dir)
    recipe = resolve_recipe(cfg.recipe, tokenizer)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; give a directory.")
    target = Target(model)
    if target.dtype_name == "q8" and engine != "batch":
        raise InputError("--dtype q8 runs in mtpspec's fused forward only; Hugging Face's generate would compute "
                         "its matrices in bf16. Use --engine batch.")
    chunks = corpus_chunks(corpus) if corpus else []
    if recipe == "chat":
        chunks = [f"Continue this text:\n{c}" for c in chunks]
    extra = (read_prompts_file(prompts_file) if prompts_file else []) + chunks
    if passages and recipe != "chat":
        raise InputError("--passages feeds the chat recipe's requests over passages; a base model (continuation "
                         "recipe) takes raw text as --corpus.")
    if cfg.everyday_share and recipe != "chat":
        raise InputError("--everyday-share feeds the chat recipe (chat turns); a base model's continuation recipe "
                         "cannot use it.")
    real = passage_chunks(passages) if passages else []
    # num_samples is not a setting: a finished run can be extended by asking for more. Settings
    # added later are left out at their off value, so the sets written before them still resume.
    unset = {"num_samples"} | (set() if real else {"passage_share"}) | (set() if cfg.everyday_share else {"everyday_share"})
    settings = {"config": {k: v for k, v in asdict(cfg).items() if k not in unset}, "recipe": recipe,
                "prompts_file": prompts_file, "corpus": corpus, "dtype": target.dtype_name}
    if real:  # the passages themselves, not only their path: other files there must not resume this run
        digest = hashlib.sha1("\0".join(t for _, t in real).encode()).hexdigest()[:16]
        settings["passages"] = {"paths": [str(p) for p in passages or []], "count": len(real), "sha1": digest}
    was = recorded_engine(out)
    if was is not None:
        engine = was  # a set is extended by the engine that wrote it
    if engine == "batch":  # up to BATCH_ROWS_MAX rows a forward: quantized matrices on AMX tiles where there are some
        with fused.blocks_on_amx() as amx:
            # the matrices' arithmetic decides the sampled tokens: a set is extended only by the same
            settings["generation"] = {**GENERATION, "matmuls": fused.matmuls(target)}
            manifest = _load_manifest(out, target, settings)
            out.mkdir(parents=True, exist_ok=True)
            return _write(model, tokenizer, out, cfg, recipe, extra, real, manifest, progress,
                          writer=_BatchWriter(target, tokenizer, cfg, stop_token_ids(model, tokenizer), head, amx))
    settings["generation"] = generation(model)
    manifest = _load_manifest(out, target, settings)
    out.mkdir(parents=True, exist_ok=True)
    # None: a set started before `fast_generate`, extended with HF's own generation, as it was written
    how = manifest["settings"].get("generation")
    with attention_implementation(model, how["attention"]) if how else contextlib.nullcontext():
        return _write(model, tokenizer, out, cfg, recipe, extra, real, manifest, progress, how is not None,
                      bool(how and how.get("batching") == "length-buckets"))


def _write(model: Any, tokenizer: Any, out: Path, cfg: DataConfig, recipe: str, extra: list[str],
           real: list[tuple[str, str]], manifest: dict[str, Any], progress: bool, fast: bool = True,
           buckets: bool = True, writer: _Writer | None = None) -> dict[str, Any]:
    """The batch loop of `generate_data`, from the manifest's resume point."""
    writer = writer or _Writer(model, tokenizer, cfg, stop_token_ids(model, tokenizer), fast, buckets)
    done = manifest["num_samples"]
    stream = _prompt_stream(cfg, recipe, extra, real)
    for _ in range(manifest["prompts_consumed"]):  # replay the deterministic stream
        next(stream)
    seen = set(manifest.get("prompt_hashes", []))
    committed = set(seen)  # the hashes of the batches written: what the manifest records
    bar = tqdm(total=cfg.num_samples, initial=done, desc=f"self-distillation data ({recipe})", unit="sample",
               disable=not progress)
    budget = _Budget()
    empty_batches = 0
    created = manifest["prompts_consumed"]

    def start(in_flight: int) -> tuple[int, Stages] | None:
        """The next batch, while the committed samples and those in flight may fall short. The
        templates draw from rng and the sampling from the batch's seed: both from the batch's place
        in the stream, so that a resumed run writes exactly what an uninterrupted one would have."""
        nonlocal created
        if done + in_flight * cfg.batch_size >= cfg.num_samples:
            return None
        batch_seed = cfg.seed * 1_000_003 + created
        rng = random.Random(batch_seed)
        batch = [next(stream) for _ in range(cfg.batch_size)]
        created += cfg.batch_size
        stages = _chat_batch(writer, batch, rng, seen) if recipe == "chat" else _continuation_batch(writer, batch, seen)
        return batch_seed, stages

    for samples, added in writer.batches(start):
        budget.tokens += sum(len(s) - p for s, p in samples)
        # One shard per batch, then the manifest: a kill between the two only repeats this
        # batch on resume (same prompts, same shard name), never duplicates or skips one.
        if samples:
            write_shard(shard_path(out, manifest["num_shards"]), samples)
            done += len(samples)
            manifest.update(num_samples=done, num_shards=manifest["num_shards"] + 1,
                            num_tokens=manifest["num_tokens"] + sum(len(s) for s, _ in samples),
                            num_response_tokens=manifest.get("num_response_tokens", 0) + sum(len(s) - p for s, p in samples))
        manifest["prompts_consumed"] += cfg.batch_size
        committed.update(added)
        manifest["prompt_hashes"] = sorted(committed)
        save_manifest(out, manifest)
        bar.update(len(samples))
        empty_batches = 0 if samples else empty_batches + 1
        if empty_batches >= 20:
            raise DataError("20 batches in a row gave no usable sample: the target's prompts are all "
                            "degenerate or unfinished. Try --prompts-file, or a higher --max-prompt-tokens.")
        bar.set_postfix(resp_tok_s=f"{budget.rate():.0f}")
        if done >= cfg.num_samples:  # batches still in flight are dropped: a later run writes them again
            break
    bar.close()
    return manifest


def settings_diff(was: dict[str, Any], now: dict[str, Any], prefix: str = "") -> str:
    """What differs between two settings dicts, one `key: was X, now Y` per leaf, nested
    keys dotted (`config.seed`): a refusal to resume names the flags to fix."""
    parts = []
    for k in sorted(set(was) | set(now), key=str):
        a, b = was.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            if sub := settings_diff(a, b, f"{prefix}{k}."):
                parts.append(sub)
        elif a != b:
            parts.append(f"{prefix}{k}: was {a!r}, now {b!r}")
    return "; ".join(parts)


def recorded_dtype(out: str | Path) -> str | None:
    """The generation dtype a data set was written in ("bfloat16", "float32", "q8": names `--dtype`
    takes), or None where out holds no set (or a damaged one: `generate_data` says what is
    wrong with it)."""
    try:
        return read_manifest(Path(out))["settings"]["dtype"]
    except (DataError, KeyError, TypeError):
        return None


# What `fused.matmuls` names, for the message that refuses to extend a set with other arithmetic
MATMULS = {"amx": "its matrices on AMX tiles", "amx-dense": "its dense matrices on AMX tiles and quantized ones on "
           "AVX-512", "avx512": "AVX-512 dot products", "torch": "PyTorch's own matmuls (no fused forward)"}
# (the writer puts blocks on the tiles wherever it can, so it never records "amx-dense")
MATMULS_WHERE = {"amx": "a CPU with AMX (amx_tile, amx_bf16)",
                 "avx512": "a CPU with avx512_bf16 and no AMX, or MTPSPEC_AMX=0 on one with AMX",
                 "torch": "a machine where the fused forward does not run, or MTPSPEC_FUSED=0"}


def check_engine(engine: str) -> None:
    if engine not in ("hf", "batch"):
        raise InputError(f"engine must be 'hf' (Hugging Face generate) or 'batch' (mtpspec's batched loop), got {engine!r}.")


def recorded_engine(out: str | Path) -> str | None:
    """"batch" or "hf": the engine a data set was written by, or None where out holds no set."""
    try:
        how = read_manifest(Path(out))["settings"].get("generation") or {}
    except (DataError, KeyError, TypeError, AttributeError):
        return None
    return "batch" if how.get("engine") == GENERATION["engine"] else "hf"


def _load_manifest(out: Path, target: Target, settings: dict[str, Any]) -> dict[str, Any]:
    ident = asdict(target.identity())
    if (out / "manifest.json").is_file():
        m = read_manifest(out)
        if m["target"] != ident:
            raise DataError(f"{out} holds data from a different target ({m['target']}); use another --out.")
        if "generation" not in m["settings"]:  # written before the setting existed: extended as it was
            settings = {k: v for k, v in settings.items() if k != "generation"}
        elif "batching" not in m["settings"]["generation"]:  # written before length buckets: one call per batch
            settings = {**settings, "generation": {k: v for k, v in settings["generation"].items() if k != "batching"}}
        was, now = m["settings"].get("generation", {}).get("matmuls"), settings.get("generation", {}).get("matmuls")
        if now is not None and was is None:  # a batched set written before it was recorded: as it was
            settings = {**settings, "generation": {k: v for k, v in settings["generation"].items() if k != "matmuls"}}
        elif was != now:
            raise DataError(f"{out} was written with {MATMULS.get(was, was)}; this process computes "
                            f"{MATMULS.get(now, now)}. Their sums round in another order, so this process would "
                            f"sample other tokens than the set's seeds gave where it was written. Extend it where "
                            f"it was written ({MATMULS_WHERE.get(was, 'the same CPU kind')}), or write a new set "
                            "here (another --out).")
        if m["settings"] != settings:
            raise DataError(f"{out} was written with other settings ({settings_diff(m['settings'], settings)}); "
                            "use the same flags to resume, or another --out for new data.")
        return m
    return {"target": ident, "settings": settings, "num_samples": 0, "num_shards": 0, "num_tokens": 0,
            "num_response_tokens": 0, "prompts_consumed": 0, "prompt_hashes": []}
