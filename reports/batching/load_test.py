"""Load test of an OpenAI-compatible server at rising concurrency: `mtpspec serve` and/or
llama.cpp's `llama-server --parallel N`, on the same GGUF file with the same threads.

    python reports/batching/load_test.py --servers mtpspec,llama-server --streams 1,2,4,8,16

For each server in turn: start it (its log goes to OUT/<server>.log), wait for /health, send one
warm-up request, then for each concurrency N run N streaming chat clients (openai's, loopback,
temperature 0, stream_options.include_usage), each sending requests one after another, then
stop the server (on Ctrl-C and errors too). A level sends N x --requests-per-stream requests;
request k asks prompt k of the built-in set, taken round-robin over its categories and wrapping
around, so every run and every server asks the same prompts. `--queue shared` (the default):
the N clients take the level's requests in order from one queue, each the next one as soon as
its last reply ends, so N are in flight until fewer than N are left (the usual closed-loop
benchmark at a fixed concurrency). `--queue per-stream`: client k % N sends request k, its own
list in turn (the design before 2026-12-06): a client with short replies runs dry early, and the
level ends on the clients with long ones, with fewer than N in flight. Each level reports how
many requests were in flight on average (the sum of request latencies over the level's wall
time), so the two can be told apart.

The first level is the reference: it answers every prompt any later level asks (so it may send
more than --requests-per-stream), and every later text is checked against it ("exact" =
equal texts / compared). Per level: aggregate completion tokens per second (all tokens over
the level's wall time), TTFT p50/p95 (send to the first non-empty text), inter-token latency
p50/p95 (per request: (last text - first text) / (tokens - 1), across requests), mean request
latency. Tokens are counted by `--count`: the server's usage (default; a reply without it is
tokenized instead, and the table says so), or the model's tokenizer on the text for every
server. `--rounds R` runs the levels R times in turn and reports each level's median round (on a
shared machine whose speed drifts over minutes, one pass of the levels can catch the first level
and a later one in different weather). Writes OUT/results.json (every request too) and
OUT/results.md.
"""

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

import mtpspec
from mtpspec import gguf
from mtpspec.models import default_gguf_path
from mtpspec.prompts import Prompt, load_prompts

SERVERS = ("mtpspec", "llama-server")
LLAMA_SERVER_CACHE = Path.home() / ".cache" / "mtpspec" / "llama-server"
GET_LLAMA_SERVER = Path(__file__).with_name("get_llama_server.sh")
ITL_RULE = "per request: (last text - first text) / (tokens - 1); percentiles across requests"


class LoadTestError(Exception):
    """A problem the user can fix; printed without a traceback."""


# --- configuration --------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    servers: tuple[str, ...]
    streams: tuple[int, ...]
    requests_per_stream: int
    queue: str  # "shared" or "per-stream"
    time_limit: float
    max_tokens: int
    count: str  # "usage" or "tokenizer"
    threads: int
    gguf: Path
    gguf_given: bool  # passed to mtpspec as --target only when named (else its embedded default)
    ctx_per_stream: int
    parallel: int  # llama-server --parallel
    mtpspec_args: tuple[str, ...]
    llama_args: tuple[str, ...]
    llama_server: str | None
    startup_timeout: float
    request_timeout: float
    out: Path
    verbose: bool
    rounds: int = 1  # every level this many times, in turn; a level reports its median round


@dataclass(frozen=True)
class Request:
    key: int  # index into the ordered prompts: the same key is the same question
    stream: int
    prompt: Prompt


@dataclass(frozen=True)
class Result:
    key: int
    stream: int
    text: str
    error: str | None
    start: float  # monotonic seconds
    first: float | None  # first non-empty text
    last: float | None  # last non-empty text
    end: float
    usage_tokens: int | None  # the server's completion_tokens, when it sent usage


# --- prompts and the requests of a level ----------------------------------------------------


def ordered_prompts() -> list[Prompt]:
    """The built-in set round-robin over its categories, so any prefix mixes them."""
    by_cat: dict[str, list[Prompt]] = {}
    for p in load_prompts():
        by_cat.setdefault(p.category, []).append(p)
    rows = max(len(v) for v in by_cat.values())
    return [v[i] for i in range(rows) for v in by_cat.values() if i < len(v)]


def level_requests(prompts: list[Prompt], streams: int, per_stream: int) -> list[list[Request]]:
    """Each stream's requests in order: request k goes to stream k % N and asks prompt k."""
    total = streams * per_stream
    plan: list[list[Request]] = [[] for _ in range(streams)]
    for k in range(total):
        plan[k % streams].append(Request(k % len(prompts), k % streams, prompts[k % len(prompts)]))
    return plan


def reference_per_stream(cfg: Config, n_prompts: int) -> int:
    """Requests per stream at the first level so it answers every prompt a later level asks."""
    needed = min(n_prompts, max(cfg.streams) * cfg.requests_per_stream)
    return max(cfg.requests_per_stream, math.ceil(needed / cfg.streams[0]))


# --- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server(given: str | None) -> str:
    candidates = [given] if given else [os.environ.get("LLAMA_SERVER"), shutil.which("llama-server"),
                                        *sorted(map(str, LLAMA_SERVER_CACHE.glob("*/bin/llama-server")))]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    where = f"{given!r} is not an executable" if given else "no llama-server on PATH, in $LLAMA_SERVER or under " \
                                                              f"{LLAMA_SERVER_CACHE}"
    raise LoadTestError(f"llama-server not found ({where}). Build it with `bash {GET_LLAMA_SERVER}` "
                        "(prints the binary's path), then pass --llama-server PATH or put it on PATH.")


def find_mtpspec() -> str:
    path = shutil.which("mtpspec", path=str(Path(sys.executable).parent)) or shutil.which("mtpspec")
    if path is None:
        raise LoadTestError(f"No `mtpspec` command next to {sys.executable} or on PATH: install mtpspec "
                            "(pip install -e .) into the Python that runs this script.")
    return path


def server_argv(name: str, cfg: Config, port: int) -> list[str]:
    if name == "mtpspec":
        target = ["--target", str(cfg.gguf)] if cfg.gguf_given else []
        return [find_mtpspec(), "serve", "--port", str(port), "--threads", str(cfg.threads), *target,
                *cfg.mtpspec_args]
    # On a CPU with AMX this llama.cpp's AMX weight buffers crash it at start (SIGSEGV, as in
    # measure/llamacpp.py): --no-repack keeps its weights in the file's own layout there.
    amx = ["--no-repack"] if "amx_tile" in cpu_flags() and "--repack" not in cfg.llama_args else []
    return [find_llama_server(cfg.llama_server), "-m", str(cfg.gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(cfg.threads), "-tb", str(cfg.threads), "--parallel", str(cfg.parallel),
            "-c", str(cfg.ctx_per_stream * cfg.parallel), *amx, *cfg.llama_args]


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _prctl() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None).prctl  # looked up before any fork: preexec_fn must not load libraries
    return None


PRCTL = _prctl() if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child: get SIGTERM when this script dies, even by SIGKILL, so no server is orphaned."""
    if PRCTL is not None:
        PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def wait_ready(proc: subprocess.Popen, url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LoadTestError(f"The server exited with code {proc.returncode} while starting; {log} ends:\n"
                                f"{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise LoadTestError(f"The server was not ready within {timeout:.0f} s (--startup-timeout); {log} ends:\n"
                        f"{_tail(log)}")


def stop(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM to the server's process group, SIGKILL after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


@contextlib.contextmanager
def running(argv: list[str], port: int, log: Path, timeout: float) -> Iterator[str]:
    """A started, ready server's base URL; stopped when the block ends, however it ends."""
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
        try:
            wait_ready(proc, url, timeout, log)
            yield url
        finally:
            stop(proc)


def mtpspec_counters(url: str) -> dict[str, float]:
    """The batch counters of `mtpspec serve`'s /metrics (steps, rows, requests x steps, step seconds)."""
    names = ("batch_steps_total", "batch_rows_total", "batch_step_seconds_total")
    got = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name.removeprefix("mtpspec_") in names + ("batch_size",):
            got[name.removeprefix("mtpspec_")] = float(value)
    got["running_sum"] = got.pop("batch_size", 0.0) * got.get("batch_steps_total", 0.0)  # the gauge is a mean over steps
    return got


def batch_numbers(before: dict[str, float], after: dict[str, float], wall: float) -> dict:
    """A level's batch steps from the counters' change: how many, rows and requests per step,
    ms per step, and the share of the wall time the decode thread was in a step."""
    steps = after["batch_steps_total"] - before["batch_steps_total"]
    if steps <= 0:
        return {}
    busy = after.get("batch_step_seconds_total", 0.0) - before.get("batch_step_seconds_total", 0.0)
    return {"steps": int(steps), "rows_per_step": round((after["batch_rows_total"] - before["batch_rows_total"]) / steps, 2),
            "requests_per_step": round((after["running_sum"] - before["running_sum"]) / steps, 2),
            "ms_per_step": round(1e3 * busy / steps, 2), "busy": round(busy / wall, 3) if wall > 0 else None}


def served_model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def _output(argv: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return " ".join((r.stdout + r.stderr).split()) if r.returncode == 0 else "unknown"
    return "unknown"


def version(argv0: str, name: str) -> str:
    """mtpspec's version and the commit of the source it runs from; llama-server's --version."""
    if name == "mtpspec":
        commit = _output(["git", "-C", str(Path(mtpspec.__file__).parent), "rev-parse", "--short", "HEAD"])
        return f"mtpspec {mtpspec.__version__}, commit {commit}"
    return _output([argv0, "--version"])


# --- clients --------------------------------------------------------------------------------


async def ask(client: AsyncOpenAI, model: str, req: Request, max_tokens: int) -> Result:
    start = time.monotonic()
    first = last = None
    parts: list[str] = []
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": req.prompt.text}], stream=True, temperature=0,
            max_tokens=max_tokens, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            piece = "".join(c.delta.content or "" for c in chunk.choices if c.delta is not None)
            if piece:
                last = time.monotonic()
                first = first or last
                parts.append(piece)
        error = None
    except Exception as e:  # an error is a result of the load test, counted and reported
        error = f"{type(e).__name__}: {e}"[:300]
    return Result(req.key, req.stream, "".join(parts), error, start, first, last, time.monotonic(), usage)


async def run_stream(client: AsyncOpenAI, model: str, reqs: list[Request], cfg: Config, deadline: float,
                     results: list[Result]) -> None:
    for req in reqs:
        if time.monotonic() >= deadline:
            return
        r = await ask(client, model, req, cfg.max_tokens)
        results.append(r)
        if cfg.verbose:
            status = r.error or f"{len(r.text)} chars, usage {r.usage_tokens}"
            print(f"    stream {r.stream} prompt {r.key}: {r.end - r.start:.2f} s, {status}", flush=True)


async def run_shared(client: AsyncOpenAI, model: str, queue: list[Request], stream: int, cfg: Config,
                     deadline: float, results: list[Result]) -> None:
    """One client of a shared queue: the next request as soon as its last reply ends (the
    asyncio loop is one thread: pop needs no lock)."""
    while queue and time.monotonic() < deadline:
        req = queue.pop(0)
        await run_stream(client, model, [Request(req.key, stream, req.prompt)], cfg, deadline, results)


async def run_level(url: str, model: str, plan: list[list[Request]], cfg: Config) -> tuple[list[Result], float]:
    # A fresh connection per request (loopback: ~0.1 ms): a kept-alive one that the server closed
    # between two requests fails the next one at once, which is no measure of the server.
    limits = httpx.Limits(max_connections=len(plan) + 4, max_keepalive_connections=0)
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=cfg.request_timeout,
                           http_client=httpx.AsyncClient(limits=limits, timeout=cfg.request_timeout)) as client:
        results: list[Result] = []
        start = time.monotonic()
        if cfg.queue == "shared":  # request k of the plan's order: key order
            queue = [reqs[i] for i in range(max(map(len, plan))) for reqs in plan if i < len(reqs)]  # request k = plan[k % N][k // N]
            await asyncio.gather(*(run_shared(client, model, queue, i, cfg, start + cfg.time_limit, results)
                                   for i in range(len(plan))))
        else:
            await asyncio.gather(*(run_stream(client, model, reqs, cfg, start + cfg.time_limit, results)
                                   for reqs in plan))
        return results, time.monotonic() - start


# --- numbers --------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class Counter:
    """Completion tokens of a reply: the server's usage, or the model's tokenizer on the text."""

    def __init__(self, path: Path, mode: str):
        from transformers import AutoTokenizer

        self.mode = mode
        self.tok = AutoTokenizer.from_pretrained(gguf.converted(gguf.open_gguf(path)), local_files_only=True)

    def tokenized(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))

    def count(self, r: Result) -> tuple[int, bool]:
        """(tokens, whether the tokenizer stood in for a missing usage)."""
        if self.mode == "usage" and r.usage_tokens is not None:
            return r.usage_tokens, False
        return self.tokenized(r.text), self.mode == "usage"


def record(r: Result, tokens: int | None, reference: dict[int, str]) -> dict:
    """One request for the JSON: its numbers, and its text where it differs from the reference."""
    differs = r.error is None and r.key in reference and r.text != reference[r.key]
    return {"key": r.key, "stream": r.stream, "tokens": tokens, "usage_tokens": r.usage_tokens,
            "ttft_s": None if r.first is None else round(r.first - r.start, 4),
            "latency_s": round(r.end - r.start, 4), "error": r.error, "text": r.text if differs else None}


def summarize(n: int, results: list[Result], wall: float, counter: Counter, reference: dict[int, str]) -> dict:
    ok = [r for r in results if r.error is None]
    counted = [counter.count(r) for r in ok]
    tokens = [t for t, _ in counted]
    ttft = [r.first - r.start for r in ok if r.first is not None]
    itl = [(r.last - r.first) / (t - 1) for r, t in zip(ok, tokens) if r.first is not None and r.last and t > 1]
    compared = [r for r in ok if r.key in reference]
    r3 = lambda x: None if x is None else round(x, 4)  # noqa: E731
    return {
        "streams": n, "requests": len(results), "errors": len(results) - len(ok),
        "first_error": next((r.error for r in results if r.error), None),
        "completion_tokens": sum(tokens), "tokenizer_fallbacks": sum(f for _, f in counted),
        "tokenizer_tokens": sum(counter.tokenized(r.text) for r in ok),
        "wall_s": r3(wall), "agg_tok_s": r3(sum(tokens) / wall if wall > 0 else 0.0),
        "ttft_p50_s": r3(pct(ttft, 0.5)), "ttft_p95_s": r3(pct(ttft, 0.95)),
        "itl_p50_ms": r3(None if not itl else pct(itl, 0.5) * 1e3),
        "itl_p95_ms": r3(None if not itl else pct(itl, 0.95) * 1e3),
        "mean_latency_s": r3(sum(r.end - r.start for r in ok) / len(ok) if ok else None),
        "in_flight": r3(sum(r.end - r.start for r in results) / wall if wall > 0 else None),
        "exact_compared": len(compared), "mismatches": sum(r.text != reference[r.key] for r in compared),
        "requests_detail": [record(r, t, reference) for r, t in zip(ok, tokens)]
                           + [record(r, None, reference) for r in results if r.error],
    }


def level_line(name: str, lv: dict) -> str:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    line = (f"[{name}] {lv['streams']:>3} streams: {lv['requests']} requests ({lv['errors']} errors), "
            f"{lv['completion_tokens']} tokens in {lv['wall_s']:.1f} s = {lv['agg_tok_s']:.1f} tok/s "
            f"({lv['in_flight']:.2f} in flight on average); "
            f"TTFT p50/p95 {fmt(lv['ttft_p50_s'], '.3f')}/{fmt(lv['ttft_p95_s'], '.3f')} s; "
            f"ITL p50/p95 {fmt(lv['itl_p50_ms'], '.1f')}/{fmt(lv['itl_p95_ms'], '.1f')} ms; "
            f"exact {lv['exact_compared'] - lv['mismatches']}/{lv['exact_compared']}")
    if b := lv.get("batch"):
        line += (f"; {b['steps']} steps, {b['rows_per_step']} rows and {b['requests_per_step']} requests a step, "
                 f"{b['ms_per_step']} ms a step, busy {b['busy']:.0%}")
    return line + (f"; first error: {lv['first_error']}" if lv["first_error"] else "")


# --- one server -----------------------------------------------------------------------------


def run_server(name: str, cfg: Config, prompts: list[Prompt], counter: Counter) -> dict:
    port = free_port()
    argv = server_argv(name, cfg, port)
    log = cfg.out / f"{name}.log"
    print(f"[{name}] starting: {shlex.join(argv)}  (log: {log})", flush=True)
    with running(argv, port, log, cfg.startup_timeout) as url:
        model = served_model(url)
        asyncio.run(run_level(url, model, [[Request(0, 0, prompts[0])]], cfg))  # warm-up, not counted
        reference: dict[int, str] = {}
        rounds: list[list[dict]] = [[] for _ in cfg.streams]  # per level, its rounds
        for rnd in range(cfg.rounds):
            for i, n in enumerate(cfg.streams):
                per_stream = reference_per_stream(cfg, len(prompts)) if i == 0 else cfg.requests_per_stream
                tag = f" (round {rnd + 1} of {cfg.rounds})" if cfg.rounds > 1 else ""
                print(f"[{name}] {n} streams x {per_stream} requests{tag} ...", flush=True)
                before = mtpspec_counters(url) if name == "mtpspec" else None
                results, wall = asyncio.run(run_level(url, model, level_requests(prompts, n, per_stream), cfg))
                first = rnd == 0 and i == 0
                if first:
                    reference = {r.key: r.text for r in results if r.error is None}
                rounds[i].append(summarize(n, results, wall, counter, {} if first else reference))
                if before is not None:
                    rounds[i][-1]["batch"] = batch_numbers(before, mtpspec_counters(url), wall)
                print(level_line(name, rounds[i][-1]), flush=True)
    print(f"[{name}] stopped", flush=True)
    return {"argv": argv, "model": model, "version": version(argv[0], name), "levels": [median_round(r) for r in rounds],
            "reference_texts": {str(k): v for k, v in sorted(reference.items())}}


def median_round(rounds: list[dict]) -> dict:
    """A level run in several rounds: its median round by aggregate tok/s (the lower middle of an
    even count), with every round's aggregate and the texts checked over all rounds."""
    if len(rounds) == 1:
        return rounds[0]
    mid = dict(sorted(rounds, key=lambda lv: lv["agg_tok_s"])[(len(rounds) - 1) // 2])
    mid["rounds_agg_tok_s"] = [lv["agg_tok_s"] for lv in rounds]
    mid["exact_compared"] = sum(lv["exact_compared"] for lv in rounds)
    mid["mismatches"] = sum(lv["mismatches"] for lv in rounds)
    mid["errors"] = sum(lv["errors"] for lv in rounds)
    mid["requests_detail"] = [dict(d, round=j) for j, lv in enumerate(rounds) for d in lv["requests_detail"]]
    return mid


# --- report ---------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def comparison(runs: dict[str, dict]) -> list[dict]:
    """Per level: each server's aggregate, its scaling over its own first level, and first/second."""
    names = list(runs)
    rows = []
    for i, n in enumerate(lv["streams"] for lv in runs[names[0]]["levels"]):
        row: dict[str, Any] = {"streams": n}
        for name in names:
            levels = runs[name]["levels"]
            agg = levels[i]["agg_tok_s"] if i < len(levels) else None
            row[f"{name}_tok_s"] = agg
            row[f"{name}_scaling"] = ratio(agg, levels[0]["agg_tok_s"])
        if len(names) == 2:
            row[f"{names[0]}/{names[1]}"] = ratio(row[f"{names[0]}_tok_s"], row[f"{names[1]}_tok_s"])
        rows.append(row)
    return rows


def same_texts(runs: dict[str, dict]) -> str | None:
    if len(runs) != 2:
        return None
    a, b = (r["reference_texts"] for r in runs.values())
    keys = sorted(set(a) & set(b))
    return f"{sum(a[k] == b[k] for k in keys)}/{len(keys)}"


def markdown(cfg: Config, runs: dict[str, dict], rows: list[dict]) -> str:
    fmt = lambda x, spec=".3f": "-" if x is None else format(x, spec)  # noqa: E731
    out = [f"# Load test: {', '.join(runs)}", "",
           f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {cfg.gguf.name}; "
           f"{cfg.threads} threads per server; max_tokens {cfg.max_tokens}, temperature 0, streaming; "
           f"{cfg.requests_per_stream} requests per stream, queue {cfg.queue} (the first level answers every "
           f"prompt the others ask), time limit {cfg.time_limit:.0f} s a level. "
           + (f"Levels run {cfg.rounds} times in turn (1, 2, ..., 1, 2, ...); each row is the level's median "
              f"round by aggregate tok/s (`rounds`: every round's), `x first` its median over the first level's, "
              f"`errors` and `exact` over all rounds. " if cfg.rounds > 1 else "")
           + f"Tokens counted by {cfg.count}. "
           f"ITL: {ITL_RULE}. `in flight`: requests in flight on average (latencies summed over the wall "
           f"time). `exact`: texts equal to the same prompt's at the first level.", ""]
    for name, run in runs.items():
        out += [f"## {name}", "", f"`{shlex.join(run['argv'])}` ({run['version']})", "",
                "| streams | requests | errors | tokens | wall s | agg tok/s | x first | TTFT p50 s | TTFT p95 s "
                "| ITL p50 ms | ITL p95 ms | mean latency s | in flight | exact |"
                + (" rounds tok/s |" if cfg.rounds > 1 else ""), "|" + "---|" * (14 + (cfg.rounds > 1))]
        base = run["levels"][0]["agg_tok_s"]
        for lv in run["levels"]:
            fb = f" ({lv['tokenizer_fallbacks']} tokenized)" if lv["tokenizer_fallbacks"] else ""
            out.append(f"| {lv['streams']} | {lv['requests']} | {lv['errors']} | {lv['completion_tokens']}{fb} "
                       f"| {lv['wall_s']:.1f} | {lv['agg_tok_s']:.1f} | {fmt(ratio(lv['agg_tok_s'], base), '.2f')} "
                       f"| {fmt(lv['ttft_p50_s'])} | {fmt(lv['ttft_p95_s'])} | {fmt(lv['itl_p50_ms'], '.1f')} "
                       f"| {fmt(lv['itl_p95_ms'], '.1f')} | {fmt(lv['mean_latency_s'])} | {fmt(lv.get('in_flight'), '.2f')} "
                       f"| {lv['exact_compared'] - lv['mismatches']}/{lv['exact_compared']} |"
                       + (f" {' / '.join(f'{a:.1f}' for a in lv['rounds_agg_tok_s'])} |" if cfg.rounds > 1 else ""))
        out.append("")
    if len(runs) > 1:
        names = list(runs)
        cols = [f"{n} tok/s" for n in names] + [f"{n} x first" for n in names] + ([f"{names[0]}/{names[1]}"]
                                                                                    if len(names) == 2 else [])
        keys = [f"{n}_tok_s" for n in names] + [f"{n}_scaling" for n in names] + cols[2 * len(names):]
        out += ["## Side by side", "", "| streams | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
        out += ["| " + " | ".join([str(r["streams"])] + [fmt(r[k], ".2f") for k in keys]) + " |" for r in rows]
        out += ["", f"First-level texts equal across the two servers: {same_texts(runs)}.", ""]
    return "\n".join(out)


def write(cfg: Config, runs: dict[str, dict]) -> None:
    rows = comparison(runs)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    data = {"config": config, "itl": ITL_RULE, "machine": {"processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version()}, "servers": runs, "comparison": rows}
    (cfg.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    md = markdown(cfg, runs, rows)
    (cfg.out / "results.md").write_text(md)
    print("\n" + md)
    print(f"wrote {cfg.out / 'results.json'} and {cfg.out / 'results.md'}")


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="mtpspec", help=f"comma-separated, run one after the other: {', '.join(SERVERS)}")
    p.add_argument("--streams", default="1,2,4,8,16", help="concurrency levels, the first is the reference")
    p.add_argument("--requests-per-stream", type=int, default=2, help="requests each client sends in turn")
    p.add_argument("--queue", choices=("shared", "per-stream"), default="shared",
                   help="shared: the clients take a level's requests from one queue (N in flight until fewer "
                        "are left); per-stream: client k %% N sends request k (each its own list)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the levels this many times in turn (1, 2, 4, ..., 1, 2, 4, ...) and report each level's "
                        "median round: on a shared machine whose speed drifts over minutes, a level and the first "
                        "one are then compared over the same stretch of time")
    p.add_argument("--time-limit", type=float, default=300, help="seconds a level may start requests for")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--count", choices=("usage", "tokenizer"), default="usage",
                   help="completion tokens from the server's usage, or the model's tokenizer on the text")
    p.add_argument("--threads", type=int, default=2, help="threads of each server (mtpspec --threads, llama -t/-tb)")
    p.add_argument("--gguf", type=Path, default=None,
                   help="model file for llama-server (and mtpspec --target) [default: the embedded SmolLM2 GGUF]")
    p.add_argument("--ctx-per-stream", type=int, default=1024, help="llama-server context per slot (-c is this x N)")
    p.add_argument("--parallel", type=int, default=None, help="llama-server --parallel [default: the largest level]")
    p.add_argument("--mtpspec-args", default="", help='extra `mtpspec serve` arguments, e.g. "-k 0 --max-queue 32"')
    p.add_argument("--llama-args", default="", help="extra llama-server arguments")
    p.add_argument("--llama-server", default=None, help="the llama-server binary [default: $LLAMA_SERVER, PATH, "
                   f"or {LLAMA_SERVER_CACHE}/*/bin/; build it with reports/batching/get_llama_server.sh]")
    p.add_argument("--startup-timeout", type=float, default=300)
    p.add_argument("--request-timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=Path("bench-out/load-test"), help="folder for results and logs")
    p.add_argument("-v", "--verbose", action="store_true", help="a line per request")
    a = p.parse_args(argv)
    servers = tuple(s.strip() for s in a.servers.split(",") if s.strip())
    if not servers or set(servers) - set(SERVERS):
        p.error(f"--servers: choose from {', '.join(SERVERS)}, got {a.servers!r}")
    try:
        streams = tuple(int(s) for s in a.streams.split(","))
    except ValueError:
        p.error(f"--streams: comma-separated counts like 1,2,4, got {a.streams!r}")
    if min(streams) < 1 or a.requests_per_stream < 1 or a.max_tokens < 1 or a.rounds < 1:
        p.error("--streams, --requests-per-stream, --max-tokens and --rounds must be >= 1")
    gguf_path = a.gguf or default_gguf_path()
    if not gguf_path.is_file():
        p.error(f"--gguf: {gguf_path} is not a file")
    return Config(servers, streams, a.requests_per_stream, a.queue, a.time_limit, a.max_tokens, a.count, a.threads,
                  gguf_path, a.gguf is not None, a.ctx_per_stream, a.parallel or max(streams),
                  tuple(shlex.split(a.mtpspec_args)), tuple(shlex.split(a.llama_args)), a.llama_server,
                  a.startup_timeout, a.request_timeout, a.out, a.verbose, a.rounds)


def _terminate(signum: int, _: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through `running`, which stops the server


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where started with SIGINT ignored (`cmd &`)
    cfg.out.mkdir(parents=True, exist_ok=True)
    try:
        if "llama-server" in cfg.servers:
            find_llama_server(cfg.llama_server)  # fail before the first server's run, not after it
        counter = Counter(cfg.gguf, cfg.count)
        prompts = ordered_prompts()
        runs = {name: run_server(name, cfg, prompts, counter) for name in cfg.servers}
    except LoadTestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130
    write(cfg, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
