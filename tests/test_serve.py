"""`mtpspec serve` as a client sees it: a real uvicorn server on 127.0.0.1 (a free port) around a
tiny model, spoken to with the openai package, httpx and a headless browser.

Properties: greedy replies equal `mtpspec.generate` and `mtpspec generate --json` token for
token; streamed chunks join to the non-streamed reply; stop strings cut it; concurrent streams
all get their whole answer; no request, however malformed, gets a 5xx or stops the server; a
full queue answers 429; a client that leaves mid-stream frees the worker."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
import urllib.parse
from contextlib import contextmanager

import httpx
import pytest
import torch
from conftest import save_tiny_model_dir, tiny_model
from typer.testing import CliRunner

import mtpspec
from mtpspec import Draft, MTPHead, SamplingConfig
from mtpspec.core import fused
from mtpspec.core.batch import AMX_DRAFT_ROWS, AMX_MAX_ROWS, BatchConfig
from mtpspec.detokenize import TextStream
from mtpspec.errors import InputError
from mtpspec.models import chat_ids, load_target
from mtpspec.serve import Engine, ServeConfig, load_engine
from mtpspec.serve.engine import DecodeRequest

K = 3
PROMPT = "w7 w8 w9"


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    """Poll until `condition()` holds: a guard against a hang (generous), not a measure of speed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.01)


@contextmanager
def serving(engine: Engine):
    """A real uvicorn server for `engine` on a free loopback port, in a background thread."""
    import uvicorn

    from mtpspec.serve.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), "the server's start")
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        engine.close()
        sock.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model, tok = save_tiny_model_dir(d)
    MTPHead.for_target(model).save_pretrained(d / "head")
    return d, tok


@pytest.fixture(scope="module")
def ref(tiny):
    """A second copy of the target and head, for expected outputs computed beside the server's."""
    d, tok = tiny
    loaded = load_target(str(d), "fp32")
    target = mtpspec.Target(loaded.model)
    return target, MTPHead.from_pretrained(d / "head", target), tok


@pytest.fixture(scope="module")
def server(tiny):
    d, _ = tiny
    # load_engine sets the process's AMX kernels for quantized matrices (a server's choice for its
    # process): set back after the module
    with fused.blocks_on_amx(False):
        engine = load_engine(str(d), str(d / "head"), "fp32", K, default_max_tokens=8, max_tokens_limit=64, max_queue=16)
        with serving(engine) as url:
            yield url, engine


def expected(ref, ids: torch.Tensor, n: int, **sampling) -> tuple[list[int], str]:
    target, head, tok = ref
    out = mtpspec.generate(target, head, ids, max_new_tokens=n, num_draft_tokens=K, **sampling)
    new = out.sequences[0, ids.shape[1]:].tolist()
    return new, tok.decode(new, skip_special_tokens=True)


def chat_body(prompt: str = PROMPT, **kw) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "temperature": 0, **kw}


def sse_events(lines) -> list:
    """The JSON events of a stream, and the [DONE] marker as the string 'DONE'."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append("DONE" if data == "[DONE]" else json.loads(data))
    return out


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(mtpspec_\S+) (\S+)$", text, re.M)}


# -- the OpenAI API through the openai package ---------------------------------------------------
def test_openai_client_greedy_equals_generate_and_the_stream_joins_to_it(server, ref):
    import openai

    url, engine = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
    name = client.models.list().data[0].id
    assert name == engine.config.model_name
    ids_new, text = expected(ref, chat_ids(ref[2], PROMPT), 20)

    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPT}], temperature=0,
                                       max_tokens=20)
    assert r.choices[0].message.content == text and r.choices[0].message.role == "assistant"
    assert r.model_extra["mtpspec"]["token_ids"] == ids_new
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (chat_ids(ref[2], PROMPT).shape[1], 20)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20
    stats = r.model_extra["mtpspec"]
    # every target forward emits one token of its own, plus the drafts it accepted
    assert 1 <= stats["target_forwards"] <= 20 and stats["num_draft_tokens"] == K

    chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPT}],
                                                 temperature=0, max_tokens=20, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].model_extra["mtpspec"]["target_forwards"] == stats["target_forwards"]
    # the playground's per-token pieces carry exactly the streamed text
    pieces = [t["text"] for c in chunks if c.model_extra.get("mtpspec") for t in c.model_extra["mtpspec"]["tokens"]]
    assert "".join(pieces) == text and len(pieces) == 20  # one word-level token, one piece

    prompt_ids = ref[2]("w10 w20", return_tensors="pt")["input_ids"]
    _, plain = expected(ref, prompt_ids, 12)
    c = client.completions.create(model=name, prompt="w10 w20", temperature=0, max_tokens=12)
    assert c.choices[0].text == plain
    streamed = client.completions.create(model=name, prompt="w10 w20", temperature=0, max_tokens=12, stream=True)
    assert "".join(x.choices[0].text for x in streamed) == plain


def test_greedy_reply_equals_the_cli_generate_json(server, tiny):
    from mtpspec.cli import app

    url, _ = server
    d, _ = tiny
    r = CliRunner().invoke(app, ["generate", "--target", str(d), "--head", str(d / "head"), "--prompt", PROMPT, "-n", "16",
                                 "-k", str(K), "--dtype", "fp32", "--json"])
    assert r.exit_code == 0, r.output
    cli = json.loads(r.stdout.strip().splitlines()[-1])
    reply = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=16), timeout=30).json()
    assert reply["choices"][0]["message"]["content"] == cli["text"]
    assert reply["mtpspec"]["token_ids"] == cli["token_ids"]


def test_a_seed_reproduces_a_sampled_reply_and_matches_generate(server, ref):
    url, _ = server
    body = chat_body(max_tokens=12, temperature=1.5, top_k=20, top_p=0.9, seed=7)
    a, b = (httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json() for _ in range(2))
    assert a["mtpspec"]["token_ids"] == b["mtpspec"]["token_ids"]
    new, _ = expected(ref, chat_ids(ref[2], PROMPT), 12, temperature=1.5, top_k=20, top_p=0.9, seed=7)
    assert a["mtpspec"]["token_ids"] == new


def test_stop_strings_cut_the_reply_and_end_it(server, ref):
    url, _ = server
    _, text = expected(ref, chat_ids(ref[2], PROMPT), 20)
    words = text.split(" ")
    for stop in (" " + words[3], [words[2] + " " + words[3], "never there"]):  # within one token; across two
        first = stop if isinstance(stop, str) else stop[0]
        want = text[: text.index(first)]
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=20, stop=stop), timeout=30).json()
        assert r["choices"][0]["message"]["content"] == want and r["choices"][0]["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] < 20  # generation ended there
        with httpx.stream("POST", url + "/v1/chat/completions", json=chat_body(max_tokens=20, stop=stop, stream=True),
                          timeout=30) as s:
            events = sse_events(s.iter_lines())
        assert events[-1] == "DONE"
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == want
        assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_text_stream_never_shows_half_a_character_or_part_of_a_stop_string():
    """Byte-level 'tokens' of UTF-8 text: released text is always a clean prefix of the final one."""
    text = "héllo wörld, ça va"
    ids = list(text.encode())
    decode = lambda xs: bytes(xs).decode("utf-8", errors="replace")  # noqa: E731
    for stop, want in (((), text), (("wö",), "héllo "), (("a v", "ld"), "héllo wör")):
        ts, shown = TextStream(decode, stop), ""
        for i, t in enumerate(ids):
            pieces = ts.push([t], [i % 2 == 0], final=i == len(ids) - 1)
            shown += "".join(p.text for p in pieces)
            assert "\ufffd" not in shown and want.startswith(shown)
            if ts.stopped:
                break
        assert shown == want == ts.text and ts.stopped == bool(stop)


# -- load ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sixteen_concurrent_streams_each_get_their_whole_answer(server, ref):
    url, engine = server
    prompts = [f"w{10 + i} w{30 + i}" for i in range(16)]
    want = {p: expected(ref, chat_ids(ref[2], p), 16)[1] for p in prompts}
    got: dict[str, str] = {}
    errors: list[str] = []

    def client(p: str) -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=chat_body(p, max_tokens=16, stream=True),
                              timeout=60) as s:
                if s.status_code != 200:
                    errors.append(f"{p}: HTTP {s.status_code}")
                    return
                events = sse_events(s.iter_lines())
            assert events[-1] == "DONE" and events[-2]["choices"][0]["finish_reason"] == "length"
            got[p] = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            errors.append(f"{p}: {type(e).__name__}: {e}")

    before = metrics(url)
    threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert errors == []
    assert got == want
    after = metrics(url)
    assert after['mtpspec_requests_total{outcome="ok"}'] - before['mtpspec_requests_total{outcome="ok"}'] == 16
    assert after["mtpspec_tokens_total"] - before["mtpspec_tokens_total"] == 16 * 16
    assert engine.queue_depth() == 0 and not engine.busy()
    steps = after["mtpspec_batch_steps_total"] - before["mtpspec_batch_steps_total"]
    assert steps < 16 * 16  # requests shared forwards: one at a time would take at least one step per token
    assert after["mtpspec_batch_step_seconds_total"] > before["mtpspec_batch_step_seconds_total"]  # the worker's busy time


def test_concurrent_seeded_samples_each_equal_the_request_served_alone(server, ref):
    """Sampled with a seed, a reply is the same whatever else the batch decodes beside it."""
    url, engine = server
    prompts = [f"w{40 + i} w{20 + i}" for i in range(6)]
    sampling = dict(temperature=0.9, top_p=0.95)
    want = {p: expected(ref, chat_ids(ref[2], p), 12, seed=i, **sampling)[1] for i, p in enumerate(prompts)}
    got: dict[str, str] = {}

    def client(i: int, p: str) -> None:
        r = httpx.post(url + "/v1/chat/completions", json={**chat_body(p, max_tokens=12, seed=i), **sampling}, timeout=60)
        got[p] = r.json()["choices"][0]["message"]["content"]

    threads = [threading.Thread(target=client, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == want


# -- faults -------------------------------------------------------------------------------------------
MSG = [{"role": "user", "content": "w7"}]
BAD_REQUESTS = [
    ("/v1/chat/completions", b"{bad", 400, "not valid JSON"),
    ("/v1/chat/completions", b"", 400, ""),
    ("/v1/chat/completions", [1, 2], 400, ""),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 0}, 400, "max_tokens must be >= 1"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": True}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 10**6}, 400, "limit of 64"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": -1}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": MSG, "top_p": 0}, 400, "top_p"),
    ("/v1/chat/completions", {"messages": MSG, "n": 2}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "w7"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": MSG, "stop": 5}, 400, "stop"),
    ("/v1/chat/completions", {"messages": MSG, "model": "gpt-4"}, 404, "not served here"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w7 " * 1100}]}, 400, "positions"),
    ("/v1/completions", {"prompt": [500]}, 400, "vocabulary"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": "w7", "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {"messages": MSG, "acceptance": "lenient"}, 400, "acceptance rule must be one of"),
    ("/v1/chat/completions", {"messages": MSG, "acceptance": "topm:3,2"}, 400, "0 <= alpha <= 1"),
    ("/v1/chat/completions", {"messages": MSG, "acceptance": 0.3}, 400, "acceptance"),
]


@pytest.mark.parametrize("path,body,status,message", BAD_REQUESTS)
def test_a_bad_request_gets_a_4xx_with_a_message_and_the_server_keeps_serving(server, path, body, status, message):
    url, _ = server
    if isinstance(body, bytes):
        r = httpx.post(url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    else:
        r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and message in err["message"]
    ok = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=2), timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_unknown_routes_and_methods_answer_in_the_same_error_shape(server):
    url, _ = server
    for r, status in ((httpx.get(url + "/v1/nothing"), 404), (httpx.get(url + "/v1/chat/completions"), 405)):
        assert r.status_code == status and "message" in r.json()["error"]


WEIRD = [None, True, False, 0, 1, 2, -1, 0.5, 1.5, -2.5, 10**9, 2**70, "", "x", "w7 w8", [], [1], ["a", 1], {}, {"a": 1},
         [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "text", "text": "w9"}]}]]
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
          "stop", "stream", "stream_options", "n", "user"]


@pytest.mark.slow
def test_fuzzed_request_bodies_never_get_a_5xx(server):
    """Random and wrong-typed values in every field, some missing, some extra: 4xx or 200, never
    5xx; /metrics counts every 200 as a request served whole and none as the worker's error."""
    url, _ = server
    rng = random.Random(13)
    before, served = metrics(url), 0
    with httpx.Client(timeout=30) as http:
        for _ in range(40):
            chat = rng.random() < 0.6
            body: dict = {"messages": [{"role": "user", "content": "w7"}]} if chat else {"prompt": "w7"}
            for f in rng.sample(FIELDS, rng.randint(1, 4)):
                if rng.random() < 0.15:
                    body.pop(f, None)
                else:
                    body[f] = rng.choice(WEIRD)
            if rng.random() < 0.1:
                body[f"x_{rng.randint(0, 9)}"] = rng.choice(WEIRD)
            path = "/v1/chat/completions" if chat else "/v1/completions"
            with http.stream("POST", url + path, json=body) as r:
                raw = r.read()
            assert r.status_code < 500, (body, raw)
            if r.status_code >= 400:
                assert "message" in json.loads(raw)["error"], (body, raw)
            elif body.get("stream") is True:
                assert raw.rstrip().endswith(b"data: [DONE]"), (body, raw)
            served += r.status_code == 200
    after = metrics(url)
    assert 0 < served < 40  # the fuzz reached the worker and was refused too
    for outcome, n in (("ok", served), ("error", 0), ("cancelled", 0)):
        key = f'mtpspec_requests_total{{outcome="{outcome}"}}'
        assert after[key] - before[key] == n, outcome
    assert httpx.get(url + "/health").json()["status"] == "ok"


# -- queue limit and disconnects, on a server whose rounds are slow ---------------------------------
class SlowDrafter:
    """Drafts k wrong tokens, slowly: plain decoding at a known, slow pace."""

    hidden_layers = (-1,)

    def propose(self, inp, k: int, sampling: SamplingConfig, generator) -> Draft:
        time.sleep(0.05)
        return Draft(tokens=torch.zeros(k, dtype=torch.long))

    def update(self, drafted: int, accepted: int) -> None:
        pass


def test_a_full_queue_gets_429_and_a_client_that_leaves_frees_the_worker(tiny):
    _, tok = tiny
    model = tiny_model()
    model.generation_config.eos_token_id = None  # nothing ends a reply early: only max_tokens or the client
    engine = Engine(model, SlowDrafter(), tok, ServeConfig(num_draft_tokens=2, max_queue=1, max_tokens_limit=400,
                                                           max_running=1))
    with serving(engine) as url:
        # A: a long stream (400 slow rounds) that the client leaves after two rounds
        with httpx.Client(timeout=30) as a_client, a_client.stream(
                "POST", url + "/v1/chat/completions", json=chat_body(max_tokens=400, stream=True)) as a:
            lines = a.iter_lines()
            seen = 0
            while seen < 3:  # the role chunk, then two rounds
                seen += next(lines).startswith("data: ")
            # B waits behind A; C finds the queue full
            b_result: dict = {}
            b = threading.Thread(target=lambda: b_result.update(
                r=httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=3), timeout=30)))
            b.start()
            wait_until(lambda: httpx.get(url + "/health").json()["queue_depth"] >= 1, "B's queueing")
            c = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=3), timeout=30)
            assert c.status_code == 429 and c.json()["error"]["code"] == "queue_full"
            assert c.headers.get("retry-after") == "1"
        # A's client is gone: its job stops at the next round and B gets the worker
        b.join(30)
        assert not b.is_alive() and b_result["r"].status_code == 200
        assert b_result["r"].json()["usage"]["completion_tokens"] == 3
        m = metrics(url)
        assert m['mtpspec_requests_total{outcome="cancelled"}'] == 1
        assert m['mtpspec_requests_total{outcome="rejected"}'] == 1
        assert m['mtpspec_requests_total{outcome="ok"}'] == 1  # B
        # A stopped far short of its 400 tokens: B's 3 and what A emitted before it was cancelled
        assert m["mtpspec_tokens_total"] < 100
        assert m["mtpspec_queue_depth"] == 0


# -- what the playground shows ---------------------------------------------------------------------
class OracleDrafter:
    """Proposes the true greedy continuation, with one wrong token in some rounds."""

    hidden_layers = (-1,)

    def __init__(self, continuation: list[int], seed: int = 0):
        self.cont = continuation
        self.rng = random.Random(seed)

    def propose(self, inp, k: int, sampling, generator) -> Draft:
        done = inp.tokens.shape[1]
        out = [self.cont[done + i] if done + i < len(self.cont) else 0 for i in range(k)]
        at = self.rng.randrange(k + 1)
        if at < k:
            out[at] = (out[at] + 1) % 97
        return Draft(tokens=torch.tensor(out, dtype=torch.long))

    def update(self, drafted: int, accepted: int) -> None:
        pass


def oracle_chunks(tok, n: int, config: ServeConfig) -> tuple[list, list[int], torch.Tensor]:
    """The chunks of one greedy reply of n tokens from an engine whose drafter knows the answer
    (OracleDrafter), the target's whole sequence, and the prompt ids."""
    model = tiny_model()
    model.generation_config.eos_token_id = None
    ids = chat_ids(tok, PROMPT)
    cont = mtpspec.generate(model, None, ids, max_new_tokens=n, num_draft_tokens=0).sequences[0].tolist()
    engine = Engine(model, OracleDrafter(cont), tok, config)

    async def run() -> list:
        job = engine.submit(DecodeRequest(ids, n, SamplingConfig()))
        chunks = []
        while (c := await job.next(30)) is not None:
            chunks.append(c)
        return chunks

    try:
        return asyncio.run(run()), cont, ids
    finally:
        engine.close()


def test_each_streamed_token_is_flagged_as_an_accepted_draft_or_the_targets_own(tiny):
    """Per round: the accepted drafts, then one token of the target's own. So over a reply the
    drafted pieces number tokens - target forwards, and every round ends with an own token."""
    chunks, cont, ids = oracle_chunks(tiny[1], 40, ServeConfig(num_draft_tokens=4))
    last = chunks[-1]
    assert [t for c in chunks for t in c.token_ids] == cont[ids.shape[1]:]
    drafted = [p.drafted for c in chunks for p in c.pieces]
    assert len(drafted) == 40 and sum(drafted) == 40 - last.target_forwards > 0
    assert all(not c.pieces[-1].drafted for c in chunks)  # each round ends with the target's own token
    assert any(len(c.pieces) > 1 for c in chunks) and last.mean_accepted > 1


def test_a_stream_interval_sends_fewer_chunks_of_the_same_reply(tiny):
    """Held text goes out with the next round's: with an interval longer than the reply, the
    first chunk and the last carry every token and piece, in order, with their flags."""
    every, cont, ids = oracle_chunks(tiny[1], 30, ServeConfig(num_draft_tokens=2))
    held, _, _ = oracle_chunks(tiny[1], 30, ServeConfig(num_draft_tokens=2, stream_interval=3600.0))
    assert len(every) > 3 and len(held) == 2
    assert [t for c in held for t in c.token_ids] == [t for c in every for t in c.token_ids] == cont[ids.shape[1]:]
    assert [p for c in held for p in c.pieces] == [p for c in every for p in c.pieces]
    assert held[-1].finish_reason == every[-1].finish_reason == "length"
    assert held[-1].completion_tokens == 30 and held[-1].target_forwards == every[-1].target_forwards
    with pytest.raises(InputError, match="stream_interval"):
        ServeConfig(stream_interval=-1)


@pytest.mark.slow
def test_playground_streams_and_colours_a_reply_in_headless_chromium(server, ref, tmp_path):
    from headless import Browser, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium found (apt-get install chromium) to load the playground page")
    url, _ = server
    assert "mtpspec playground" in httpx.get(url + "/").text
    _, text = expected(ref, chat_ids(ref[2], PROMPT), 24)
    browser = Browser(binary)
    try:
        browser.open(url + "/?" + urllib.parse.urlencode({"prompt": PROMPT, "max_tokens": 24, "autorun": 1}))
        assert browser.wait_for("document.body.dataset.state === 'done'", timeout=30), \
            browser.evaluate("document.getElementById('status').textContent")
        assert browser.evaluate("document.getElementById('out').textContent") == text
        spans = browser.evaluate("[...document.querySelectorAll('#out span.tok')].map(s => s.className)")
        assert len(spans) == 24 and all(c in ("tok draft", "tok own") for c in spans)
        assert browser.evaluate("document.getElementById('s_tokens').textContent") == "24"
        shot = browser.screenshot(tmp_path / "playground.png")
    finally:
        browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_a_relaxed_rule_is_per_request_and_every_reply_says_which(server, ref):
    """A request's `acceptance` decodes that request only, as `mtpspec.generate` does under the same
    rule; its reply and each streamed chunk name the rule, /metrics counts it, and the next request
    without one is exact again."""
    url, _ = server
    rule = "topm:3,0.1"
    new, _ = expected(ref, chat_ids(ref[2], PROMPT), 16, acceptance=rule)
    before = metrics(url)
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=16, acceptance=rule), timeout=30).json()
    assert r["mtpspec"]["token_ids"] == new
    assert r["mtpspec"]["acceptance"] == rule and r["mtpspec"]["exact"] is False
    with httpx.stream("POST", url + "/v1/chat/completions", json=chat_body(max_tokens=16, acceptance=rule, stream=True),
                      timeout=30) as s:
        events = [e for e in sse_events(s.iter_lines()) if e != "DONE" and "mtpspec" in e]
    assert events and all(e["mtpspec"]["acceptance"] == rule for e in events)
    assert metrics(url)["mtpspec_relaxed_requests_total"] - before["mtpspec_relaxed_requests_total"] == 2
    exact = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=16), timeout=30).json()
    assert exact["mtpspec"]["acceptance"] == "exact" and exact["mtpspec"]["exact"] is True
    assert exact["mtpspec"]["token_ids"] == expected(ref, chat_ids(ref[2], PROMPT), 16)[0]


# -- health, metrics, CLI ------------------------------------------------------------------------------
def test_a_chats_next_turn_copies_the_last_turns_cache_and_replies_as_alone(server, ref):
    """The server keeps finished requests' caches (`prefix_keep`): a follow-up turn, whose prompt
    begins with the last turn's prompt and reply, copies those positions instead of prefilling
    them, and its reply is still what it decodes alone."""
    url, engine = server
    assert engine.batch.config.prefix_keep == ServeConfig().prefix_keep > 0
    if engine.target.engine != "fused":
        pytest.skip("prefixes are copied on the fused engine only (the torch engine prefills every prompt)")
    tok = ref[2]
    first = [{"role": "user", "content": "w11 w12 w13 w14"}]
    r1 = httpx.post(url + "/v1/chat/completions", json={"messages": first, "temperature": 0, "max_tokens": 12},
                    timeout=30).json()
    answer = r1["choices"][0]["message"]["content"]
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "w21 w22"}]
    ids = tok.apply_chat_template(second, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    turn1 = tok.apply_chat_template(first, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    before = engine.batch.reused_tokens
    r2 = httpx.post(url + "/v1/chat/completions", json={"messages": second, "temperature": 0, "max_tokens": 12},
                    timeout=30).json()
    assert r2["choices"][0]["message"]["content"] == expected(ref, ids, 12)[1]
    # copied: the longest prefix the new prompt shares with what the first turn left in its cache
    # (its prompt and reply, all but the reply's last id), short of the prompt's last id
    held = turn1[0].tolist() + r1["mtpspec"]["token_ids"][:-1]
    new = ids[0].tolist()
    shared = next((i for i, (a, b) in enumerate(zip(new, held)) if a != b), min(len(new), len(held)))
    assert engine.batch.reused_tokens - before == min(shared, len(new) - 1) >= turn1.shape[1] - 1 > 0


def test_health_and_metrics_count_what_was_served(server):
    url, engine = server
    h = httpx.get(url + "/health").json()
    assert h == {"status": "ok", "model": engine.config.model_name, "num_draft_tokens": K, "queue_depth": 0, "running": 0,
                 "busy": False, "amx_blocks": fused.uses_amx()}
    before = metrics(url)
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=5), timeout=30).json()
    after = metrics(url)
    assert after['mtpspec_requests_total{outcome="ok"}'] - before['mtpspec_requests_total{outcome="ok"}'] == 1
    assert after["mtpspec_tokens_total"] - before["mtpspec_tokens_total"] == 5
    assert after["mtpspec_target_forwards_total"] - before["mtpspec_target_forwards_total"] == r["mtpspec"]["target_forwards"]
    assert after["mtpspec_tokens_per_second"] > 0 and after["mtpspec_mean_accepted"] >= 1.0
    text = httpx.get(url + "/metrics").text
    for name in ("requests_total", "tokens_total", "tokens_per_second", "mean_accepted", "queue_depth"):
        assert f"# TYPE mtpspec_{name} " in text


def test_cli_serve_passes_host_and_port_to_uvicorn(tiny, monkeypatch, process_kernels):
    import uvicorn
    from fastapi import FastAPI

    from mtpspec.cli import app

    d, _ = tiny
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: calls.append((app_, kw)))
    runner = CliRunner()
    r = runner.invoke(app, ["serve", "--target", str(d), "--head", str(d / "head"), "--dtype", "fp32", "--port", "8123"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1 and isinstance(calls[0][0], FastAPI)
    assert calls[0][1] == {"host": "127.0.0.1", "port": 8123}
    r = runner.invoke(app, ["serve", "--target", str(d), "--port", "9", "--host", "127.0.0.1", "--max-queue", "-1"])
    assert r.exit_code == 2 and "max_queue must be >= 0" in r.output
    assert len(calls) == 1



@pytest.fixture
def process_kernels():
    """load_engine sets the process's AMX kernels for quantized matrices: set back after the test."""
    with fused.blocks_on_amx(False):
        yield


def test_config_refuses_bad_limits_and_resolves_amx_blocks():
    for bad in (dict(max_tokens_limit=0), dict(default_max_tokens=0)):
        with pytest.raises(InputError, match="must be >= 1"):
            ServeConfig(**bad)
    with pytest.raises(InputError, match="prefix_keep must be >= 0"):
        ServeConfig(prefix_keep=-1)
    assert ServeConfig(prefix_keep=3).batch_config().prefix_keep == 3
    assert ServeConfig().wants_amx_blocks() and not ServeConfig(max_running=1).wants_amx_blocks()
    assert not ServeConfig(amx_blocks=False).wants_amx_blocks() and ServeConfig(max_running=1, amx_blocks=True).wants_amx_blocks()
    # rows cost little on AMX tiles: the running requests share more drafts there
    assert ServeConfig(amx_blocks=True).batch_config().draft_rows == AMX_DRAFT_ROWS > BatchConfig().draft_rows
    assert ServeConfig(amx_blocks=False).batch_config().draft_rows == BatchConfig().draft_rows
    # and more rows a forward, unless max_rows is given
    assert ServeConfig(amx_blocks=True).batch_config().max_rows == AMX_MAX_ROWS
    assert ServeConfig(amx_blocks=False).batch_config().max_rows == 48 < AMX_MAX_ROWS
    assert ServeConfig(amx_blocks=True, max_rows=32).batch_config().max_rows == 32
    with pytest.raises(InputError, match="max_rows must be in"):
        ServeConfig(max_rows=AMX_MAX_ROWS + 1)


def test_load_engine_puts_blocks_on_amx_tiles_only_for_a_batching_server(tiny, process_kernels):
    """Where the CPU has AMX: on for max_running > 1, off for one request at a time; elsewhere off,
    and the engine's config says which took effect."""
    d, _ = tiny
    one = load_engine(str(d), d / "head", "fp32", max_running=1)
    assert one.config.amx_blocks is False
    one.close()
    many = load_engine(str(d), d / "head", "fp32", max_running=4)
    assert many.config.amx_blocks is fused.uses_amx()
    many.close()


def test_a_switch_engine_replies_as_plain_decoding(tiny):
    """`mtpspec serve --switch`: lookup-or-head rounds, the same reply as plain decoding."""
    from mtpspec.core.drafters import SWITCH_TOKENS, SwitchDrafter
    from mtpspec.serve import load_engine

    d, tok = tiny
    engine = load_engine(str(d), d / "head", "fp32", drafter="switch")
    ids = chat_ids(tok, PROMPT + " " + PROMPT)  # a repeated prompt: the lookup finds matches
    plain = mtpspec.generate(engine.target, None, ids, max_new_tokens=24, num_draft_tokens=0).sequences[0].tolist()

    async def run() -> list:
        job = engine.submit(DecodeRequest(ids, 24, SamplingConfig()))
        out = []
        while (c := await job.next(30)) is not None:
            out += c.token_ids
        return out

    try:
        assert isinstance(engine.drafter, SwitchDrafter) and engine.config.num_draft_tokens == SWITCH_TOKENS
        assert asyncio.run(run()) == plain[ids.shape[1]:]
    finally:
        engine.close()
