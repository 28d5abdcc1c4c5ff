"""The one decoding worker: a thread that owns the target and the drafter and decodes up to
`max_running` requests together (continuous batching, `core/batch.py`), admitting waiting
requests in arrival order from a bounded queue as running ones finish.

The HTTP side (asyncio) submits a `DecodeRequest` and reads the `Job`'s chunks as they come: the
worker drives the library's `Batch` (no copy of the decode loop): each step is one target
forward over the rounds of the running requests and chunks of the prompts being prefilled, and
each round's newly released text is handed over as soon as it is accepted. Every reply is what
the request decodes alone, whatever else runs beside it (the batch's guarantee). A job that is
cancelled (its client went away, or it stopped reading) is dropped from the queue, or leaves the
batch at the next step, so its place is free again."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import AcceptanceConfig, SamplingConfig
from ..core.batch import AMX_DRAFT_ROWS, AMX_MAX_ROWS, Batch, BatchConfig, Slot
from ..core.decode import DecodeState, Round
from ..core.drafters import build_drafter
from ..core.head import MTPHead
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
    # Requests that may wait while `max_running` are decoded; one more is refused with 429.
    max_queue: int = 16
    # Requests decoded together (continuous batching); 1 = one at a time.
    max_running: int = 8
    # Rows one target forward may run (running requests' rounds plus prompt chunks; `BatchConfig`).
    # None: AMX_MAX_ROWS where quantized matrices run on AMX tiles (rows cost little there, and a
    # joining prompt then fits one step more often), else BatchConfig's default (48).
    max_rows: int | None = None
    # Finished requests whose caches are kept for the next prompts that begin as theirs did (a
    # chat's next turn, the same system prompt or instructions): those prompts copy the shared
    # prefix's keys and values instead of prefilling it (`BatchConfig.prefix_keep`; exact, the
    # copied slots are what their own prefill writes). Memory: each kept cache is its request's
    # own (prompt + max_tokens + 64 slots; ~7 MB for SmolLM2 at 300). 0 keeps none (running
    # requests are still read).
    prefix_keep: int = 8
    # Seconds a running request's new text may wait to go out with its next round's (0: every
    # round goes out as soon as it is accepted). Fewer, larger chunks when many requests run:
    # each chunk costs the event loop a socket write and wakes the client, on the cores that
    # compute the forwards. The first chunk and the last are never held; the text is the same.
    stream_interval: float = 0.0
    # The most new tokens one request may ask for (max_tokens above it: 400).
    max_tokens_limit: int = 1024
    # New tokens for a request that names no max_tokens (capped by max_tokens_limit).
    default_max_tokens: int = 128
    # Stop strings one request may give.
    max_stop: int = 16
    # Quantized matrices (a GGUF target's blocks) on the AMX tiles, where the CPU has them
    # (`fused.amx_blocks`): many rows per forward cost about one there, one row costs more than
    # on AVX-512. None = when max_running > 1. `load_engine` sets it for the process.
    amx_blocks: bool | None = None

    def __post_init__(self) -> None:
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise InputError(f"num_draft_tokens must be >= 0 (0 = plain decoding), got {self.num_draft_tokens}.")
        if self.max_queue < 0:
            raise InputError(f"max_queue must be >= 0, got {self.max_queue}.")
        if self.max_running < 1:
            raise InputError(f"max_running must be >= 1, got {self.max_running}.")
        if self.stream_interval < 0:
            raise InputError(f"stream_interval must be >= 0 seconds, got {self.stream_interval}.")
        if self.max_tokens_limit < 1 or self.default_max_tokens < 1:
            raise InputError("max_tokens_limit and default_max_tokens must be >= 1.")
        self.batch_config()  # refuses a bad max_rows or prefix_keep with its reason

    def batch_config(self) -> BatchConfig:
        """The batch the worker decodes on: max_rows a forward, up to 16 of them for prompts, the
        last prefix_keep finished requests' caches kept for their prefixes; where quantized
        matrices run on AMX tiles (rows cost little there), AMX_MAX_ROWS rows a forward unless
        max_rows says otherwise and AMX_DRAFT_ROWS draft rows shared by the running requests,
        else BatchConfig's rows and draft rows."""
        more = {"draft_rows": AMX_DRAFT_ROWS} if self.amx_blocks else {}
        rows = self.max_rows if self.max_rows is not None else AMX_MAX_ROWS if self.amx_blocks else BatchConfig.max_rows
        return BatchConfig(max_rows=rows, prefill_rows=min(16, rows), prefix_keep=self.prefix_keep, **more)

    def wants_amx_blocks(self) -> bool:
        """amx_blocks, with None resolved: on when requests are batched."""
        return self.max_running > 1 if self.amx_blocks is None else self.amx_blocks


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
        """From another thread: hand over a chunk, an error, or None (the end)."""
        push_all([(self, item)])

    async def next(self, timeout: float | None = None) -> Chunk | None:
        """The next chunk, None after the last; raises the worker's error. `timeout`: raise
        TimeoutError if nothing came in that many seconds (the chunk is not lost)."""
        item = await asyncio.wait_for(self._out.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item


def push_all(items: list[tuple[Job, Chunk | BaseException | None]]) -> None:
    """Hand over many jobs' items with one wake-up of each event loop, in order. The worker sends
    a step's chunks this way: one wake-up per step instead of one per request, so the event
    loop's thread competes less with the forward for the two cores."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Chunk | BaseException | None]]] = {}
    for job, item in items:
        by_loop.setdefault(job._loop, []).append((job, item))
    for loop, group in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, group)
        except RuntimeError:  # the event loop is gone (server shut down): nobody will read
            for job, _ in group:
                job._cancelled.set()


def _put_all(group: list[tuple[Job, Chunk | BaseException | None]]) -> None:
    for job, item in group:
        job._out.put_nowait(item)


@dataclass
class Metrics:
    """Counters for /metrics, updated by the worker and the HTTP side (under `lock`)."""

    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    relaxed: int = 0  # requests decoded under a relaxed acceptance rule (their output is not the target's own)
    total: DecodeStats = field(default_factory=DecodeStats)
    steps: int = 0  # batch steps (target forwards of the worker)
    rows: int = 0  # rows over those forwards
    running_sum: int = 0  # requests in the batch, summed over the steps
    step_s: float = 0.0  # seconds the worker spent in steps (draft, forward, accept), summed
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self, rows: int, running: int, seconds: float) -> None:
        with self.lock:
            self.steps += 1
            self.rows += rows
            self.running_sum += running
            self.step_s += seconds

    def count(self, outcome: str, stats: DecodeStats | None = None) -> None:
        with self.lock:
            self.requests[outcome] += 1
            self.relaxed += stats is not None and stats.acceptance != "exact"
            if stats is not None:
                self.total = DecodeStats.merge([self.total, stats])


@dataclass
class _Active:
    """A job in the batch: its slot there and the text released so far."""

    slot: Slot
    text: TextStream
    held: Chunk | None = None  # released text not sent yet (ServeConfig.stream_interval)
    sent_at: float | None = None  # when its last chunk went out (None: none yet)


class Engine:
    """Owns a target, a drafter and a tokenizer; decodes up to `max_running` requests together on its own thread."""

    def __init__(self, target: Any, drafter: Any, tokenizer: Any, config: ServeConfig | None = None):
        """`target`: a `Target` or a Hugging Face model; `drafter`: a `Drafter` (an `MTPHead`, or one
        `build_drafter` built), None = plain decoding."""
        self._setup(target, drafter, tokenizer, config)
        self._thread = threading.Thread(target=self._work, name="mtpspec-decode", daemon=True)
        self._thread.start()

    @classmethod
    def loading(cls, load: Callable[[], tuple[Any, Any, Any, ServeConfig]]) -> Engine:
        """An engine whose decode thread first calls `load()` (-> target, drafter, tokenizer,
        config), then decodes: every torch and OpenMP computation of the model runs on that one
        thread. Why: each thread that runs parallel work gets its own OpenMP thread pool, and with
        more pool threads than CPUs libgomp stops spinning at its barriers; a model loaded on one
        thread and decoded on another took 1.8x as long a forward (2 cores, measured). Raises
        what `load` raised."""
        self = cls.__new__(cls)
        ready, failed = threading.Event(), []

        def run() -> None:
            try:
                self._setup(*load())
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                failed.append(e)
                return
            finally:
                ready.set()
            self._work()

        self._thread = threading.Thread(target=run, name="mtpspec-decode", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self

    def _setup(self, target: Any, drafter: Any, tokenizer: Any, config: ServeConfig | None) -> None:
        self.target = target if isinstance(target, Target) else Target(target)
        self.tokenizer = tokenizer
        self.config = config or ServeConfig()
        self.drafter, k = build_drafter(drafter, "chain", k=self.config.num_draft_tokens)
        self._k = k if drafter is not None else 0
        self.metrics = Metrics()
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._active: dict[Job, _Active] = {}  # the jobs in the batch (written by the worker, under _cond)
        self._outbox: list[tuple[Job, Chunk | BaseException | None]] = []  # the worker's, sent once a step
        self.batch = Batch(self.target, self.config.batch_config())
        # The HTTP side encodes prompts while the worker decodes replies: a fast tokenizer's
        # Rust object must not be used by two threads at once ("Already borrowed").
        self._tokenizer_lock = threading.Lock()

    # -- what the HTTP side calls ----------------------------------------------------------------
    @property
    def num_draft_tokens(self) -> int:
        return self._k

    def queue_depth(self) -> int:
        """Requests waiting for a place in the batch."""
        with self._cond:
            return len(self._waiting)

    def running(self) -> int:
        """Requests being decoded (prefilled or decoding) in the batch."""
        with self._cond:
            return len(self._active)

    def busy(self) -> bool:
        return self.running() > 0

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
            raise BusyError(f"The queue is full ({self.config.max_queue} requests waiting while {self.config.max_running} "
                            "are decoded); retry later.")
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
        """Cancel what waits, let the running jobs stop at the next step, end the worker."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            running = list(self._active)
            self._cond.notify_all()
        for job in waiting + running:
            job._cancelled.set()
            job.push(None)
        self._thread.join(timeout)

    # -- the worker thread -----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            self._flush()  # what the last pass queued (a step's chunks, admission errors, cancellations)
            with self._cond:
                while not self._waiting and not self._active and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
                admit = []
                while self._waiting and len(self._active) + len(admit) < self.config.max_running:
                    admit.append(self._waiting.popleft())
            for job in admit:
                self._admit(job)
            for job in [j for j in list(self._active) if j.cancelled]:
                self._leave(job, "cancelled")
            if not self.batch.slots:
                continue
            try:
                t0 = time.perf_counter()
                rounds = self.batch.step()
            except Exception as e:  # a bug, not the user's mistake: report it to every running job, keep serving
                log.exception("decoding failed")
                for job in list(self._active):
                    self._send(job, e)
                    self._leave(job, "error")
                continue
            self.metrics.step(self.batch.rows_last, len(self._active), time.perf_counter() - t0)
            by_slot = {id(a.slot): job for job, a in self._active.items()}
            for slot, new in rounds:
                self._release(by_slot[id(slot)], new)
        for job in list(self._active):
            self._leave(job, "cancelled")
        self._flush()

    def _send(self, job: Job, item: Chunk | BaseException | None) -> None:
        """From the worker: queue an item for the job; `_flush` sends what a step queued at once."""
        self._outbox.append((job, item))

    def _flush(self) -> None:
        items, self._outbox = self._outbox, []
        if items:
            push_all(items)

    def _admit(self, job: Job) -> None:
        """A waiting job joins the batch (its prompt is prefilled by the next steps), with its own
        drafter where the drafter adapts per round (a tree, switch: `copy.copy` of the template);
        a head or None is shared."""
        r = job.request
        drafter = self.drafter if self.drafter is None or isinstance(self.drafter, MTPHead) else copy.copy(self.drafter)
        try:
            slot = self.batch.add(r.input_ids, r.max_new_tokens, drafter, self.num_draft_tokens, r.sampling, None,
                                  r.acceptance)
        except MtpspecError as e:
            self._send(job, e)
            self._send(job, None)
            self.metrics.count("error")
            return
        with self._cond:
            self._active[job] = _Active(slot, TextStream(self.decode, r.stop))

    def _release(self, job: Job, new: Round) -> None:
        """Push a round's released text; a job that is done (EOS, max_tokens, a stop string) leaves."""
        a = self._active[job]
        state = a.slot.state
        try:
            pieces = a.text.push(new.tokens, new.drafted, final=state.done)
        except Exception as e:  # the detokenizer failed: this job ends, the others go on
            log.exception("detokenizing failed")
            self._send(job, e)
            self._leave(job, "error")
            return
        done = state.done or a.text.stopped
        chunk = self._chunk(state, new, pieces, self._finish_reason(state, a.text) if done else None)
        if a.held is not None:
            chunk = dataclasses.replace(chunk, pieces=a.held.pieces + chunk.pieces,
                                        token_ids=a.held.token_ids + chunk.token_ids)
        now = time.perf_counter()
        if done or a.sent_at is None or now - a.sent_at >= self.config.stream_interval:
            self._send(job, chunk)
            a.held, a.sent_at = None, now
        else:
            a.held = chunk
        if done:
            self._leave(job, "ok")

    def _leave(self, job: Job, outcome: str) -> None:
        """The job leaves the batch (its cache goes with it) and its stream ends."""
        with self._cond:
            a = self._active.pop(job, None)
        if a is None:
            return
        if a.slot in self.batch.slots:
            self.batch.remove(a.slot)
        self._send(job, None)
        self.metrics.count(outcome, a.slot.state.stats)

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
    """Prometheus text format. tokens_per_second is each request's own rate over its decoding time,
    pooled (with several requests at once the server's aggregate is higher: tokens_total over time)."""
    m = engine.metrics
    with m.lock:
        requests, relaxed = dict(m.requests), m.relaxed
        total, steps, rows, running_sum, step_s = m.total, m.steps, m.rows, m.running_sum, m.step_s
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
        ("queue_depth", "gauge", "Requests waiting for a place in the batch.", engine.queue_depth()),
        ("busy", "gauge", "1 while a request is being decoded.", int(engine.busy())),
        ("running", "gauge", "Requests in the batch now (being prefilled or decoded).", engine.running()),
        ("batch_steps_total", "counter", "Batch steps: target forwards over the running requests' rows.", steps),
        ("batch_rows_total", "counter", "Rows over those forwards (verify rows and prompt chunks).", rows),
        ("rows_per_forward", "gauge", "Mean rows per batch step.", round(rows / steps, 3) if steps else 0.0),
        ("batch_size", "gauge", "Mean requests in the batch per step.", round(running_sum / steps, 3) if steps else 0.0),
        ("batch_step_seconds_total", "counter", "Seconds the decode thread spent in batch steps (its busy time).",
         round(step_s, 3)),
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
    `config`: further ServeConfig fields. Sets the process's AMX kernels for quantized matrices
    (`ServeConfig.amx_blocks`; the engine's config says what took effect) before the model loads."""
    from ..core import fused
    from ..models import load_target
    from ..pretrained import resolve_head

    cfg = ServeConfig(**config)  # a bad setting fails here, before the model loads

    def load() -> tuple[Target, Any, Any, ServeConfig]:
        amx_blocks = fused.amx_blocks(cfg.wants_amx_blocks())
        loaded = load_target(target, dtype, weights)
        tgt = Target(loaded.model)
        built, k = build_drafter(resolve_head(tgt, loaded.name, head, warn=warn, assistants=True).head, drafter,
                                 k=num_draft_tokens)
        return tgt, built, loaded.tokenizer, dataclasses.replace(cfg, model_name=loaded.name, num_draft_tokens=k,
                                                                 amx_blocks=amx_blocks)

    return Engine.loading(load)  # loaded and decoded on one thread (see Engine.loading)
