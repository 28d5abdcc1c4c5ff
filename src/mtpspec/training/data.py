"""Self-distillation data: the frozen target writes the prompts and the answers.

The head must learn what the *target* would say, so the training text is the target's own
output. With no external dataset the target writes its own user turns (the Magpie idea:
run the chat template up to "user:" and let the model continue), seeded with openers for
the on-device workloads a generic chat set misses (notification summaries, proofreading,
rewriting, smart replies, short answers, code completion, extraction, translation, math).
Optional sources: a prompts file (jsonl with "prompt"/"turns"/"text", or txt, one per line)
and a raw-text corpus (plain text; chunks become "continue this" prompts).

Output: `shard_XXXXX.safetensors` files of token ids (one per generated batch) plus
`manifest.json` (target identity, settings, counts). A killed run resumes from the manifest:
finished shards are kept and the prompt stream, deterministic from the seed, is replayed past
the prompts already consumed, so nothing is duplicated or skipped.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..core.target import Target
from ..errors import DataError, InputError

MANIFEST = "manifest.json"
_MANIFEST_KEYS = ("target", "settings", "num_samples", "num_shards", "num_tokens", "prompts_consumed")

# Openers for the user turn. The target continues each one, so the prompt's content is its own.
TASK_OPENERS: dict[str, list[str]] = {
    "summarize": [
        "Summarize these notifications in one sentence:\n",
        "Summarize this message thread briefly:\n",
        "Give me a short summary of this email:\n",
        "TL;DR of the following article:\n",
        "Summarize the key points of this news story:\n",
    ],
    "proofread": [
        "Proofread this text and fix any mistakes:\n",
        "Correct the grammar and spelling in this sentence:\n",
        "Fix the typos in my message:\n",
    ],
    "rewrite": [
        "Rewrite this message to sound more polite:\n",
        "Make this text more concise:\n",
        "Rewrite this in a friendly, casual tone:\n",
        "Paraphrase the following paragraph:\n",
    ],
    "reply": [
        "Suggest three short replies to this message:\n",
        "How should I reply to this text from my friend?\n",
        "Write a quick response to this email:\n",
    ],
    "chat": [
        "",
        "What is",
        "How do I",
        "Can you explain",
        "Why does",
        "Give me some tips for",
        "Write a short story about",
        "Write a poem about",
    ],
    "code": [
        "Complete this Python function:\n```python\ndef ",
        "Write a Python function that",
        "Fix the bug in this code:\n```python\n",
        "Write a JavaScript function to",
        "Explain what this code does:\n```python\n",
    ],
    "extract": [
        "Extract the names and dates from this text:\n",
        "List the action items from this message:\n",
    ],
    "translate": [
        "Translate this sentence into French:\n",
        "Translate the following into English:\n",
    ],
    "math": [
        "Solve this math problem step by step:\n",
        "A word problem:",
    ],
    "qa": [
        "Answer the question using the context below.\nContext:",
        "Who was",
        "When did",
    ],
}


@dataclass(frozen=True)
class DataConfig:
    # Number of (prompt, response) samples to write in total.
    num_samples: int = 2000
    # Sequences generated together (batched HF generate); each batch is one shard, the unit
    # of resumption.
    batch_size: int = 32
    # Longest self-written user turn, in tokens.
    max_prompt_tokens: int = 96
    # Longest response, in tokens.
    max_response_tokens: int = 256
    # Temperature of the self-written prompts (they must vary).
    prompt_temperature: float = 1.0
    # Temperature of the responses: 0 = greedy, what greedy decoding will verify against.
    response_temperature: float = 0.0
    # Share of samples whose user turn starts from a task opener (the rest: free Magpie turns).
    task_share: float = 0.8
    # Keep only user turns the target finished itself (ended with a stop token).
    require_finished_prompts: bool = True
    # Seed of the prompt stream and of each batch's sampling; a resume replays it exactly.
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size", "max_prompt_tokens", "max_response_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"DataConfig.{name} must be >= 1.")
        if not 0.0 <= self.task_share <= 1.0:
            raise InputError("DataConfig.task_share must be in [0, 1].")


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


def corpus_prompts(path: str | Path, chunk_chars: int = 600) -> list[str]:
    """A raw-text corpus as prompts: each chunk becomes a 'continue this text' request."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Corpus file {p} does not exist.")
    text = p.read_text(errors="replace")
    chunks = [text[i:i + chunk_chars].strip() for i in range(0, len(text), chunk_chars)]
    out = [f"Continue this text:\n{c}" for c in chunks if len(c) > 40]
    if not out:
        raise DataError(f"Corpus file {p} holds no usable text.")
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


def _batched_generate(model: Any, tokenizer: Any, texts: list[str], max_new: int, temperature: float,
                      stop_ids: list[int]) -> list[list[int]]:
    """Left-padded batched HF generate -> the new token ids of each row, cut at the first stop."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw: dict[str, Any] = {"do_sample": temperature > 0}
    if temperature > 0:
        kw.update(temperature=temperature, top_p=0.95, top_k=0)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new, eos_token_id=stop_ids,
                             pad_token_id=tokenizer.pad_token_id, **kw)
    rows = []
    for r in out[:, enc["input_ids"].shape[1]:].tolist():
        cut = next((i for i, t in enumerate(r) if t in stop_ids), None)
        rows.append(r if cut is None else r[: cut + 1])
    return rows


def _prompt_stream(cfg: DataConfig, extra: list[str]) -> Iterator[tuple[str, str]]:
    """Deterministic stream of (kind, opener-or-prompt). Kinds: 'magpie' (the target continues
    the opener as the user's text) or 'given' (a ready prompt from a file or corpus)."""
    rng = random.Random(cfg.seed)
    kinds = list(TASK_OPENERS)
    i = 0
    while True:
        if extra and i % 2 == 1:  # with a prompts file or corpus: every other sample uses it
            yield "given", extra[rng.randrange(len(extra))]
        elif rng.random() < cfg.task_share:
            kind = kinds[rng.randrange(len(kinds))]
            yield "magpie", TASK_OPENERS[kind][rng.randrange(len(TASK_OPENERS[kind]))]
        else:
            yield "magpie", ""
        i += 1


def generate_data(model: Any, tokenizer: Any, out_dir: str | Path, cfg: DataConfig,
                  prompts_file: str | None = None, corpus: str | None = None, progress: bool = True) -> dict[str, Any]:
    # The model's dtype is part of the settings: bf16 batched generation is ~6x faster than
    # fp32 on CPUs with avx512_bf16, and its rare argmax flips hardly matter for training.
    """Write `cfg.num_samples` target-generated samples into out_dir (resumable).

    Everything that can be wrong with the inputs (no chat template, a missing or malformed
    prompts file or corpus, out_dir holding other data) is refused before out_dir is created,
    so a failed start leaves nothing behind."""
    out = Path(out_dir)
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or "The target's tokenizer"
        raise InputError(f"{name} has no chat template; `mtpspec data` writes chat turns (user prompt, then the "
                         "target's answer) through it. Use a chat/instruct model, or add a chat_template to its "
                         "tokenizer_config.json.")
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; give a directory.")
    target = Target(model)
    extra = (read_prompts_file(prompts_file) if prompts_file else []) + (corpus_prompts(corpus) if corpus else [])
    # num_samples is not a setting: a finished run can be extended by asking for more.
    settings = {"config": {k: v for k, v in asdict(cfg).items() if k != "num_samples"},
                "prompts_file": prompts_file, "corpus": corpus,
                "dtype": str(target.dtype).removeprefix("torch.")}
    manifest = _load_manifest(out, target, settings)
    out.mkdir(parents=True, exist_ok=True)
    stop_ids = stop_token_ids(model, tokenizer)
    done = manifest["num_samples"]
    stream = _prompt_stream(cfg, extra)
    for _ in range(manifest["prompts_consumed"]):  # replay the deterministic stream
        next(stream)
    seen = set(manifest.get("prompt_hashes", []))
    bar = tqdm(total=cfg.num_samples, initial=done, desc="self-distillation data", unit="sample", disable=not progress)
    budget = _Budget()
    empty_batches = 0
    while done < cfg.num_samples:
        # HF sampling draws from torch's global generator: seed it per batch so that a resumed
        # run writes exactly what an uninterrupted one would have.
        torch.manual_seed(cfg.seed * 1_000_003 + manifest["prompts_consumed"])
        batch = [next(stream) for _ in range(cfg.batch_size)]
        consumed = cfg.batch_size
        # 1. User turns: given prompts as they are; Magpie openers continued by the target.
        magpie = [op for kind, op in batch if kind == "magpie"]
        prefixes = [_chat_prefix(tokenizer, op) for op in magpie]
        written = _batched_generate(model, tokenizer, prefixes, cfg.max_prompt_tokens, cfg.prompt_temperature, stop_ids) if magpie else []
        users, wi = [], 0
        for kind, op in batch:
            if kind == "given":
                users.append(op)
            else:
                ids = written[wi]
                wi += 1
                text = op + tokenizer.decode([t for t in ids if t not in stop_ids], skip_special_tokens=True)
                finished = bool(ids) and ids[-1] in stop_ids
                ok = not is_degenerate(ids) and (finished or not cfg.require_finished_prompts)
                users.append(text.strip() if ok else "")
        # 2. Deduplicate and drop degenerate or unfinished user turns.
        keep = []
        for u in users:
            h = hashlib.sha1(u.encode()).hexdigest()[:16]
            if len(u) >= 8 and h not in seen:
                seen.add(h)
                keep.append(u)
        # 3. Responses from the target, greedy by default.
        chats = [tokenizer.apply_chat_template([{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True) for u in keep]
        answers = _batched_generate(model, tokenizer, chats, cfg.max_response_tokens, cfg.response_temperature, stop_ids) if chats else []
        samples = []
        for chat, ans in zip(chats, answers):
            if not is_degenerate(ans):
                p_ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
                samples.append((p_ids + ans, len(p_ids)))
                budget.tokens += len(ans)
        samples = samples[: cfg.num_samples - done]
        # 4. One shard per batch, then the manifest: a kill between the two only repeats this
        # batch on resume (same prompts, same shard name), never duplicates or skips one.
        if samples:
            _write_shard(out / f"shard_{manifest['num_shards']:05d}.safetensors", samples)
            done += len(samples)
            manifest.update(num_samples=done, num_shards=manifest["num_shards"] + 1,
                            num_tokens=manifest["num_tokens"] + sum(len(c[0]) for c in samples))
        manifest["prompts_consumed"] += consumed
        manifest["prompt_hashes"] = sorted(seen)
        _save_manifest(out, manifest)
        bar.update(len(samples))
        empty_batches = 0 if samples else empty_batches + 1
        if empty_batches >= 20:
            raise DataError("20 batches in a row gave no usable sample: the target's prompts are all "
                            "degenerate or unfinished. Try --prompts-file, or a higher --max-prompt-tokens.")
        bar.set_postfix(tok_s=f"{budget.rate():.0f}")
    bar.close()
    return manifest


def _write_shard(path: Path, samples: list[tuple[list[int], int]]) -> None:
    ids = torch.tensor([t for s, _ in samples for t in s], dtype=torch.int32)
    lengths = torch.tensor([len(s) for s, _ in samples], dtype=torch.int32)
    prompt_lengths = torch.tensor([p for _, p in samples], dtype=torch.int32)
    tmp = path.with_suffix(".tmp")
    save_file({"ids": ids, "lengths": lengths, "prompt_lengths": prompt_lengths}, str(tmp))
    tmp.rename(path)


def _load_manifest(out: Path, target: Target, settings: dict[str, Any]) -> dict[str, Any]:
    ident = asdict(target.identity())
    if (out / MANIFEST).is_file():
        m = read_manifest(out)
        if m["target"] != ident:
            raise DataError(f"{out} holds data from a different target ({m['target']}); use another --out.")
        if m["settings"] != settings:
            raise DataError(f"{out} was written with other settings ({m['settings']}); use the same "
                            "flags to resume, or another --out for new data.")
        return m
    return {"target": ident, "settings": settings, "num_samples": 0, "num_shards": 0, "num_tokens": 0,
            "prompts_consumed": 0, "prompt_hashes": []}


def _save_manifest(out: Path, m: dict[str, Any]) -> None:
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(m))
    tmp.rename(out / MANIFEST)


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The manifest of a data directory written by `mtpspec data`; a DataError if there is none
    or it is not one."""
    d = Path(data_dir)
    path = d / MANIFEST
    if not path.is_file():
        raise DataError(f"{d} is not an mtpspec data directory (no {MANIFEST}); run `mtpspec data` first.")
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); delete {d} and run `mtpspec data` again.") from None
    missing = [k for k in _MANIFEST_KEYS if not isinstance(m, dict) or k not in m]
    if missing:
        raise DataError(f"{path} is not an mtpspec data manifest (missing {', '.join(missing)}); "
                        f"delete {d} and run `mtpspec data` again.")
    return m


def load_samples(data_dir: str | Path) -> list[tuple[torch.Tensor, int]]:
    """All (token ids (T,), prompt length) pairs of a data directory, in shard order."""
    d = Path(data_dir)
    m = read_manifest(d)
    out = []
    for i in range(m["num_shards"]):
        shard = d / f"shard_{i:05d}.safetensors"
        try:
            s = load_file(str(shard))
        except (OSError, SafetensorError) as e:
            raise DataError(f"{shard} is missing or unreadable ({e}); the manifest lists {m['num_shards']} shards. "
                            "Rerun `mtpspec data` with the same flags to rewrite it.") from None
        for seq, pl in zip(torch.split(s["ids"].long(), s["lengths"].tolist()), s["prompt_lengths"].tolist()):
            out.append((seq, int(pl)))
    if not out:
        raise DataError(f"{d} holds no samples yet.")
    return out
