"""The one decoding worker: a thread that owns the target and the drafter and serves requests
one at a time, in arrival order, from a bounded queue.

The HTTP side (asyncio) submits a `DecodeRequest` and reads the `Job`'s chunks as they come: the
worker drives the library's `prefill` and `step` itself (no copy of the decode loop) and hands
over each round's newly released text as soon as the round is accepted. A job that is cancelled
(its client went away, or it stopped reading) is dropped from the queue, or stops at the next
round boundary, so its slot is free again."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import AcceptanceConfig, SamplingConfig
from ..core.decode import DecodeState, Round, prefill, step
from ..core.drafters import build_drafter
from ..core.stats import DecodeStats
from ..core.target import Target
from ..detokenize import Piece, TextStream
from ..errors import BusyError, InputError, MtpspecError

log = logging.getLogger("mtpspec.serve")

# Outcomes counted in /metrics.
OUTCOMES = ("ok", "cancelled", "error", "rejected")


@dataclass(frozen=True)
class ServeConfig:
    # The model id that GET /v1/models lists and every response echoes.
    model_name: str = "mtpspec"
    # Drafts per round; 0 = plain decoding (same output, one target forward per token); None =
    # the drafter's own k (a head's measured best, `drafters.default_k`).
    num_draft_tokens: int | None = None
    # Requests that may wait behind the one being decoded; one more is refused with 429.
    max_queue: int = 16
    # The most new tokens one request may ask for (max_tokens above it: 400).
    max_tokens_limit: int = 1024
    # New tokens for a request that names no max_tokens (capped by max_tokens_limit).
    default_max_tokens: int = 128
    # Stop strings one request may give.
    max_stop: int = 16

    def __post_init__(self) -> None:
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise InputError(f"num_draft_tokens must be >= 0 (0 = plain decoding), got {self.num_draft_tokens}.")
        if self.max_queue < 0:
            raise InputError(f"max_queue must be >= 0, got {self.max_queue}.")
        if self.max_tokens_limit < 1 or self.default_max_tokens < 1:
            raise InputError("max_tokens_limit and default_max_tokens must be >= 1.")


@dataclass(frozen=True)
class DecodeRequest:
    input_ids: torch.Tensor  # (1, T) prompt ids, chat template already applied
    max_new_tokens: int
    sampling: SamplingConfig
    stop: tuple[str, ...] = ()
    acceptance: AcceptanceConfig = AcceptanceConfig()  # exact unless the request asked for a relaxed rule


@dataclass(frozen=True)
class Chunk:
    """What one round released: its text (as per-token pieces) and the request's running stats."""

    pieces: tuple[Piece, ...]
    token_ids: tuple[int, ...]  # the round's new tokens
    prompt_tokens: int
    completion_tokens: int  # so far
    target_forwards: int  # so far, the prefill included
    mean_accepted: float  # tokens per verify forward so far
    tokens_per_s: float | None
    finish_reason: str | None = None  # on the last chunk: "stop" (EOS or a stop string) or "length"
    acceptance: str = "exact"  # the rule the reply is decoded under (`AcceptanceConfig.label`)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


class Job:
    """One request's place in the queue, and the channel its chunks arrive on (asyncio side)."""

    def __init__(self, request: DecodeRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self._loop = loop
        self._out: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def push(self, item: Chunk | BaseException | None) -> None:
        """From the worker thread: hand over a chunk, an error, or None (the end)."""
        try:
            self._loop.call_soon_threadsafe(self._out.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shut down): nobody will read
            self._cancelled.set()

    async def next(self, timeout: float | None = None) -> Chunk | None:
        """The next chunk, None after the last; raises the worker's error. `timeout`: raise
        TimeoutError if nothing came in that many seconds (the chunk is not lost)."""
        item = await asyncio.wait_for(self._out.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item


@dataclass
class Metrics:
    """Counters for /metrics, updated by the worker and the HTTP side (under `lock`)."""

    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    relaxed: int = 0  # requests decoded under a relaxed acceptance rule (their output is not the target's own)
    total: DecodeStats = field(default_factory=DecodeStats)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str, stats: DecodeStats | None = None) -> None:
        with self.lock:
            self.requests[outcome] += 1
            self.relaxed += stats is not None and stats.acceptance != "exact"
            if stats is not None:
                self.total = DecodeStats.merge([self.total, stats])


class Engine:
    """Owns a target, a drafter and a tokenizer; decodes one request at a time on its own thread."""

    def __init__(self, target: Any, drafter: Any, tokenizer: Any, config: ServeConfig | None = None):
        """`target`: a `Target` or a Hugging Face model; `drafter`: a `Drafter` (an `MTPHead`, or one
        `build_drafter` built), None = plain decoding."""
        self.target = target if isinstance(target, Target) else Target(target)
        self.tokenizer = tokenizer
        self.config = config or ServeConfig()
        self.drafter, k = build_drafter(drafter, "chain", k=self.config.num_draft_tokens)
        self._k = k if drafter is not None else 0
        self.metrics = Metrics()
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._running: Job | None = None
        # The HTTP side encodes prompts while the worker decodes replies: a fast tokenizer's
        # Rust object must not be used by two threads at once ("Already borrowed").
        self._tokenizer_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="mtpspec-decode", daemon=True)
        self._thread.start()

    # -- what the HTTP side calls ----------------------------------------------------------------
    @property
    def num_draft_tokens(self) -> int:
        return self._k

    def queue_depth(self) -> int:
        """Requests waiting behind the one being decoded."""
        with self._cond:
            return len(self._waiting)

    def busy(self) -> bool:
        with self._cond:
            return self._running is not None

    def encode_chat(self, messages: list[dict[str, str]]) -> torch.Tensor:
        """The tokenizer's chat template over all messages, ready for the assistant's turn -> (1, T)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise InputError("This model's tokenizer has no chat template; use /v1/completions with a plain prompt.")
        try:
            with self._tokenizer_lock:
                enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                         return_dict=True)
        except Exception as e:  # the template's own checks (roles must alternate, ...) raise jinja errors
            raise InputError(f"The chat template refused these messages: {e}") from None
        return enc["input_ids"]

    def encode_text(self, prompt: str | list[int]) -> torch.Tensor:
        """A plain prompt (no template) as text or token ids -> (1, T)."""
        if isinstance(prompt, list):
            return torch.tensor([prompt], dtype=torch.long)
        with self._tokenizer_lock:
            return self.tokenizer(prompt, return_tensors="pt")["input_ids"]

    def decode(self, ids: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def request(self, input_ids: torch.Tensor, max_tokens: int | None, sampling: SamplingConfig,
                stop: tuple[str, ...] = (), acceptance: AcceptanceConfig | None = None) -> DecodeRequest:
        """Check a request against this server's limits before it takes a place in the queue."""
        limit = self.config.max_tokens_limit
        n = min(self.config.default_max_tokens, limit) if max_tokens is None else max_tokens
        if n < 1:
            raise InputError(f"max_tokens must be >= 1, got {n}.")
        if n > limit:
            raise InputError(f"max_tokens {n} exceeds this server's limit of {limit} (mtpspec serve --max-tokens-limit).")
        if input_ids.shape[1] == 0:
            raise InputError("The prompt is empty after tokenization; send some text.")
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= self.target.vocab_size:
            raise InputError(f"Prompt token ids must be in [0, {self.target.vocab_size}), the model's vocabulary.")
        if len(stop) > self.config.max_stop:
            raise InputError(f"At most {self.config.max_stop} stop strings, got {len(stop)}.")
        self.target.check_length(input_ids.shape[1] + n)  # an over-long prompt fails here, not in the worker
        return DecodeRequest(input_ids=input_ids, max_new_tokens=n, sampling=sampling, stop=stop,
                             acceptance=acceptance or AcceptanceConfig())

    def submit(self, request: DecodeRequest) -> Job:
        """Queue a request (from the event loop); BusyError when the queue is full."""
        job = Job(request, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise BusyError("The server is shutting down; retry on another instance.")
            if len(self._waiting) >= self.config.max_queue:
                full = True
            else:
                full = False
                self._waiting.append(job)
                self._cond.notify()
        if full:
            self.metrics.count("rejected")
            raise BusyError(f"The queue is full ({self.config.max_queue} requests waiting behind the one being "
                            "decoded); retry later.")
        return job

    def cancel(self, job: Job) -> None:
        """Stop a job: drop it from the queue, or end it at the next round. Idempotent."""
        if job.cancelled:
            return
        job._cancelled.set()
        with self._cond:
            waiting = job in self._waiting
            if waiting:
                self._waiting.remove(job)
        if waiting:
            self.metrics.count("cancelled")
            job.push(None)

    def close(self, timeout: float = 30.0) -> None:
        """Cancel what waits, let the running job stop at its next round, end the worker."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            running = self._running
            self._cond.notify_all()
        for job in waiting + ([running] if running else []):
            job._cancelled.set()
            job.push(None)
        self._thread.join(timeout)

    # -- the worker thread -----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._running = self._waiting.popleft()
            try:
                self._decode(job)
            finally:
                with self._cond:
                    self._running = None

    def _decode(self, job: Job) -> None:
        """prefill, then step until done, pushing each round's released text."""
        r = job.request
        k = self.num_draft_tokens
        layers = self.drafter.hidden_layers if self.drafter is not None and k > 0 else (-1,)
        text = TextStream(self.decode, r.stop)
        state: DecodeState | None = None
        outcome = "error"
        try:
            state, new = prefill(self.target, r.input_ids, r.max_new_tokens, layers, r.sampling, None, k, r.acceptance)
            while True:  # `new`: the round's tokens and which of them were accepted drafts
                pieces = text.push(new.tokens, new.drafted, final=state.done)
                done = state.done or text.stopped
                job.push(self._chunk(state, new, pieces, self._finish_reason(state, text) if done else None))
                if done:
                    outcome = "ok"
                    break
                if job.cancelled:
                    outcome = "cancelled"
                    break
                new = step(self.target, self.drafter, state, k)
        except MtpspecError as e:
            job.push(e)
        except Exception as e:  # a bug, not the user's mistake: report it, keep serving
            log.exception("decoding failed")
            job.push(e)
        finally:
            job.push(None)
            self.metrics.count(outcome, state.stats if state is not None else None)

    @staticmethod
    def _finish_reason(state: DecodeState, text: TextStream) -> str:
        return "stop" if text.stopped or int(state.tokens[0, -1]) in state.eos else "length"

    @staticmethod
    def _chunk(state: DecodeState, new: Round, pieces: list[Piece], finish: str | None) -> Chunk:
        s = state.stats
        return Chunk(pieces=tuple(pieces), token_ids=new.tokens, prompt_tokens=state.prompt_length,
                     completion_tokens=state.num_new, target_forwards=s.target_forwards, mean_accepted=s.mean_accepted,
                     tokens_per_s=s.tokens_per_s, finish_reason=finish, acceptance=s.acceptance)


def render_metrics(engine: Engine) -> str:
    """Prometheus text format."""
    m = engine.metrics
    with m.lock:
        requests, relaxed = dict(m.requests), m.relaxed
        total = m.total
    tps = total.tokens_per_s or 0.0
    lines = ["# HELP mtpspec_requests_total Requests by outcome (rejected = queue full).",
             "# TYPE mtpspec_requests_total counter"]
    lines += [f'mtpspec_requests_total{{outcome="{o}"}} {requests[o]}' for o in OUTCOMES]
    for name, kind, help_, value in (
        ("relaxed_requests_total", "counter", "Requests decoded under a relaxed acceptance rule (not the target's own "
         "output).", relaxed),
        ("tokens_total", "counter", "New tokens generated.", total.new_tokens),
        ("target_forwards_total", "counter", "Target forward passes (prefills included).", total.target_forwards),
        ("tokens_per_second", "gauge", "New tokens per second of decoding, over all requests.", round(tps, 3)),
        ("mean_accepted", "gauge", "Tokens per verify forward over all requests (1.0 = no gain from drafts).",
         round(total.mean_accepted, 4)),
        ("queue_depth", "gauge", "Requests waiting behind the one being decoded.", engine.queue_depth()),
        ("busy", "gauge", "1 while a request is being decoded.", int(engine.busy())),
    ):
        lines += [f"# HELP mtpspec_{name} {help_}", f"# TYPE mtpspec_{name} {kind}", f"mtpspec_{name} {value}"]
    return "\n".join(lines) + "\n"


def load_engine(target: str | None = None, head: str | Path | None = None, dtype: str = "auto",
                num_draft_tokens: int | None = None, warn: Any = None, drafter: str = "chain", weights: str = "auto",
                **config: Any) -> Engine:
    """The model, its head and tokenizer, loaded as `mtpspec generate` loads them, in an Engine.
    `drafter`: a `build_drafter` kind ("chain", "tree", "switch", ...), built as `mtpspec
    generate` builds it; `num_draft_tokens` None: that drafter's default k. `weights`: as
    `load_target`'s (auto: a GGUF target's blocks wherever the fused forward runs them).
    `config`: further ServeConfig fields."""
    from ..models import load_target
    from ..pretrained import resolve_head

    loaded = load_target(target, dtype, weights)
    tgt = Target(loaded.model)
    built, k = build_drafter(resolve_head(tgt, loaded.name, head, warn=warn).head, drafter, k=num_draft_tokens)
    return Engine(tgt, built, loaded.tokenizer, ServeConfig(model_name=loaded.name, num_draft_tokens=k, **config))
