"""The HTTP app around one `Engine`: OpenAI-compatible completions (streamed as server-sent
events), /health, /metrics, and the playground page at /.

Every mistake in a request (malformed JSON, a wrong type, max_tokens out of range, a prompt
too long for the model) is a 4xx with OpenAI's error shape {"error": {message, type, code}};
a full queue is a 429. Nothing a client sends should produce a 5xx."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..errors import BusyError, MtpspecError
from .engine import Chunk, Engine, Job, render_metrics
from .schema import ChatRequest, CompletionRequest

POLL_S = 0.25  # how often a request still waiting for its first tokens checks that its client is there


class _ClientGone(Exception):
    """The client disconnected before its reply was ready."""


def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def _error(status: int, message: str, type_: str, code: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


class _JobStream(StreamingResponse):
    """An event stream that releases its job however it ends: finished, client gone, or never started."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _Reply:
    """The JSON shapes of one kind of endpoint (chat or plain completion)."""

    def __init__(self, chat: bool, engine: Engine):
        self.chat = chat
        self.engine = engine
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, stream: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.engine.config.model_name}

    def _stats(self, c: Chunk) -> dict[str, Any]:
        return {"mean_accepted": round(c.mean_accepted, 4), "target_forwards": c.target_forwards,
                "num_draft_tokens": self.engine.num_draft_tokens, "acceptance": c.acceptance,
                "exact": c.acceptance == "exact",
                "tokens_per_s": round(c.tokens_per_s, 2) if c.tokens_per_s else None}

    @staticmethod
    def _usage(c: Chunk) -> dict[str, int]:
        return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                "total_tokens": c.prompt_tokens + c.completion_tokens}

    def full(self, chunks: list[Chunk]) -> dict[str, Any]:
        last = chunks[-1]
        text = "".join(c.text for c in chunks)
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        ids = [t for c in chunks for t in c.token_ids]
        return {**self._head(False), "choices": [choice], "usage": self._usage(last),
                "mtpspec": {**self._stats(last), "token_ids": ids}}

    def start(self) -> str | None:
        """The chat stream opens with the assistant's role, as OpenAI's does."""
        if not self.chat:
            return None
        return _sse({**self._head(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                      "finish_reason": None}]})

    def event(self, c: Chunk) -> str:
        """One round: its text, and per token whether it was an accepted draft (for the playground)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": c.finish_reason}
        if self.chat:
            choice["delta"] = {"content": c.text}
        else:
            choice.update(text=c.text, logprobs=None)
        obj = {**self._head(True), "choices": [choice],
               "mtpspec": {**self._stats(c), "completion_tokens": c.completion_tokens,
                           "tokens": [{"text": p.text, "drafted": p.drafted} for p in c.pieces]}}
        if c.finish_reason is not None:
            obj["usage"] = self._usage(c)
        return _sse(obj)


async def _next(job: Job, request: Request) -> Chunk | None:
    """The job's next chunk; while it waits (in the queue, or in the prefill), notice a client that left."""
    while True:
        try:
            return await job.next(timeout=POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                raise _ClientGone from None


def create_app(engine: Engine) -> FastAPI:
    """A FastAPI app serving `engine` (which the caller owns and closes)."""
    app = FastAPI(title="mtpspec", docs_url=None, redoc_url=None, openapi_url=None)

    # -- errors: OpenAI's shape, 4xx for anything a client did ----------------------------------
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        parts = []
        if errs and errs[0].get("type") == "json_invalid":
            where = errs[0].get("loc", ("body", "?"))[-1]
            return _error(400, f"The body is not valid JSON (at character {where}): {errs[0].get('ctx', {}).get('error', '')}",
                          "invalid_request_error", "invalid_json")
        for e in errs[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        param = ".".join(str(x) for x in errs[0].get("loc", ()) if x != "body") if errs else None
        return _error(400, "; ".join(parts) or "Invalid request body.", "invalid_request_error", "invalid_request",
                      param or None)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, str(exc.detail), "invalid_request_error", code)

    @app.exception_handler(BusyError)
    async def _busy(_: Request, exc: BusyError) -> JSONResponse:
        return _error(429, str(exc), "rate_limit_error", "queue_full", headers={"Retry-After": "1"})

    @app.exception_handler(MtpspecError)
    async def _user(_: Request, exc: MtpspecError) -> JSONResponse:
        return _error(400, str(exc), "invalid_request_error", "invalid_request")

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"Internal error ({type(exc).__name__}); the server keeps serving.", "server_error",
                      "internal_error")

    # -- completions -----------------------------------------------------------------------------
    async def complete(request: Request, body: ChatRequest | CompletionRequest, reply: _Reply, ids: Any) -> Response:
        name = engine.config.model_name
        if body.model is not None and body.model != name:
            return _error(404, f"Model {body.model!r} is not served here; this server serves {name!r} (GET /v1/models).",
                          "invalid_request_error", "model_not_found", "model")
        job = engine.submit(engine.request(ids, body.token_limit(), body.sampling(), body.stop_strings(),
                                           body.acceptance_rule()))
        try:
            first = await _next(job, request)  # prefill errors are still a 4xx here
        except _ClientGone:
            engine.cancel(job)
            return Response(status_code=499)
        except BaseException:
            engine.cancel(job)
            raise
        if first is None:
            raise BusyError("The server is shutting down; retry on another instance.")
        if body.stream:
            return _JobStream(_events(job, first, reply, request), lambda: engine.cancel(job))
        chunks = [first]
        try:
            while chunks[-1].finish_reason is None:
                nxt = await _next(job, request)
                if nxt is None:
                    raise BusyError("The request was stopped before it finished (server shutting down).")
                chunks.append(nxt)
        except _ClientGone:
            return Response(status_code=499)
        finally:
            engine.cancel(job)
        return JSONResponse(reply.full(chunks))

    async def _events(job: Job, first: Chunk, reply: _Reply, request: Request) -> AsyncIterator[str]:
        start = reply.start()
        if start:
            yield start
        chunk: Chunk | None = first
        try:
            while chunk is not None:
                yield reply.event(chunk)
                if chunk.finish_reason is not None:
                    break
                if await request.is_disconnected():  # stop decoding for nobody
                    return
                chunk = await job.next()
        except MtpspecError as e:
            yield _sse(error_body(str(e), "invalid_request_error", "invalid_request"))
        except Exception as e:
            yield _sse(error_body(f"Internal error ({type(e).__name__}).", "server_error", "internal_error"))
        finally:
            engine.cancel(job)
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        ids = engine.encode_chat([m.as_template_input() for m in body.messages])
        return await complete(request, body, _Reply(True, engine), ids)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await complete(request, body, _Reply(False, engine), engine.encode_text(body.prompt))

    # -- the rest --------------------------------------------------------------------------------
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": engine.config.model_name, "object": "model", "created": 0,
                                            "owned_by": "mtpspec"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": engine.config.model_name, "num_draft_tokens": engine.num_draft_tokens,
                "queue_depth": engine.queue_depth(), "running": engine.running(), "busy": engine.busy(),
                "amx_blocks": bool(engine.config.amx_blocks)}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(engine), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def playground() -> HTMLResponse:
        return HTMLResponse(resources.files(__package__).joinpath("static/index.html").read_text(encoding="utf-8"))

    return app
