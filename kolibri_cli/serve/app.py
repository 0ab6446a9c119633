"""The ASGI app (Starlette): routes, the bearer key, the body limit, the access log.

GET /health, /version, /metrics, /v1/models; POST /v1/completions and /v1/chat/completions,
streamed (server-sent events) or not. A request is read and checked here (requests.py), queued
for the worker (worker.py) — refused with 503 at once when the queue is full — and answered as
its ids arrive; a client that disconnects cancels its generation. Every failure is a JSON error
body in OpenAI's shape with a 4xx status (a kolibri bug: 500), and the server goes on.
Non-goals: TLS, CORS, rate limits per client.
"""

import asyncio
import hmac
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kolibri_cli.decode.stops import TextDeltas
from kolibri_cli.serve import responses
from kolibri_cli.serve.requests import ApiError, Served, chat_ask, completion_ask, parse_body
from kolibri_cli.serve.worker import Busy, Job

Log = Callable[[dict], None]
CLOSED = ApiError(499, "the client closed the request", kind="cancelled")  # nginx's 499


class Api:
    """The state the routes share: what is served, the worker, the metrics."""

    def __init__(self, served: Served, worker, metrics, spec: bool):
        self.served, self.worker, self.metrics, self.spec = served, worker, metrics, spec
        self.started = int(time.time())
        # tokenizing a body near --max-body takes a second or more: done on this one thread,
        # the event loop goes on streaming the running request and answering the others
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="kolibri-read")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def version(self, request: Request) -> Response:
        from kolibri_cli import __version__

        return JSONResponse({"version": __version__, "engine": "kolibri"})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=_metrics_type())

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.served.name, "object": "model", "created": self.started,
             "owned_by": "kolibri", "max_model_len":
             self.served.model.config.max_position_embeddings}]})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, completion_ask, "cmpl")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat_ask, "chatcmpl")

    async def _generate(self, request: Request, parse, prefix: str) -> Response:
        try:
            raw = await _body(request, self.served.limits.max_body)
            ask = await asyncio.get_running_loop().run_in_executor(
                self.reader, lambda: parse(parse_body(raw), self.served))
        except ApiError as e:
            self.metrics.count("invalid")
            return error(e)
        except ClientDisconnect:  # gone before its body was all sent: nobody reads an answer
            self.metrics.count("cancelled")
            return error(CLOSED)
        rid = f"{prefix}-{uuid.uuid4().hex}"
        request.state.request_id = rid
        events: asyncio.Queue = asyncio.Queue()
        job = Job(rid, ask, lambda kind, value: None)
        job.emit = _emitter(asyncio.get_running_loop(), events, job)
        try:
            self.worker.submit(job)
        except Busy:
            self.metrics.count("refused")
            return error(ApiError(503, f"the server is busy ({self.served.limits.max_queue} "
                                  "requests waiting); retry shortly", code="server_busy",
                                  kind="server_error"), {"Retry-After": "1"})
        head = responses.Head(rid, int(time.time()), self.served.name, ask)
        if ask.stream:
            tokenizer = self.served.model.tokenizer
            return StreamingResponse(_stream(request, job, events, head, tokenizer),
                                     media_type="text/event-stream",
                                     headers={"X-Request-Id": rid, "Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        return await _whole(request, job, events, head)


def _emitter(loop, events: asyncio.Queue, job: Job):
    """The worker's way into this request's event queue (from its own thread)."""
    def emit(kind: str, value) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: shut down past --drain-timeout
            job.cancel()
    return emit


async def _whole(request: Request, job: Job, events: asyncio.Queue,
                 head: responses.Head) -> Response:
    """Wait for the finished generation (cancelling it if the client leaves first)."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        while True:
            kind, value = await events.get()
            if kind == "done":
                result, usage = value
                _note_usage(request, result, usage)
                return JSONResponse(responses.answer(head, result, usage),
                                    headers={"X-Request-Id": job.id})
            if kind == "error":
                return error(value)
            if kind == "cancelled":
                return error(CLOSED)
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once done


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def _stream(request: Request, job: Job, events: asyncio.Queue, head: responses.Head,
                  tokenizer):
    """The stream's events; closed early (the client left), it cancels the generation."""
    texts, first = TextDeltas(tokenizer, head.ask.stop), True
    try:
        if head.chat:
            yield responses.chunk(head, "", first=True)
            first = False
        while True:
            kind, value = await events.get()
            if kind == "tokens":
                text = texts.add(value)
                if text or head.ask.return_token_ids or first:
                    yield responses.chunk(head, text, value, first=first)
                    first = False
            elif kind == "done":
                result, usage = value
                _note_usage(request, result, usage)
                yield responses.chunk(head, texts.finish(), [], result.stop_reason, first)
                if head.ask.include_usage:
                    yield responses.usage_chunk(head, result, usage)
                yield responses.DONE
                return
            else:  # an error (a cancelled job's client is gone: nothing reads this)
                yield responses.event(value.body() if kind == "error" else {})
                return
    finally:
        job.cancel()


def _note_usage(request: Request, result, usage) -> None:
    """What the access log adds for a generation."""
    request.state.usage = usage.to_dict() | {"finish_reason": result.stop_reason,
                                             "mode": result.mode}


async def _body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes before it is all read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise ApiError(413, f"the request body exceeds the limit of {limit} bytes")
        chunks.append(piece)
    return b"".join(chunks)


def error(e: ApiError, headers: dict | None = None) -> Response:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's error shape."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                          kind=kind), getattr(exc, "headers", None))


async def _bug(request: Request, exc: Exception) -> Response:
    return error(ApiError(500, f"internal error ({type(exc).__name__}); this is a kolibri bug",
                          kind="server_error"))


def _metrics_type() -> str:
    from kolibri_cli.serve.metrics import CONTENT_TYPE

    return CONTENT_TYPE


def build(api: Api, key: str | None, log: Log) -> Starlette:
    routes = [
        Route("/health", api.health), Route("/version", api.version),
        Route("/metrics", api.metrics_text), Route("/v1/models", api.models),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error,
                                                       Exception: _bug})
    return AccessLog(BearerKey(app, key), log)


class BearerKey:
    """With a key, /v1/ routes answer 401 unless `Authorization: Bearer KEY` (compared in
    constant time); /health, /version and /metrics stay open, as vLLM's do."""

    def __init__(self, app, key: str | None):
        self.app, self.expected = app, f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send) -> None:
        if (self.expected is not None and scope["type"] == "http"
                and scope["path"].startswith("/v1/")):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error(ApiError(401, "a valid API key is needed: send Authorization: "
                                          "Bearer KEY", code="invalid_api_key",
                                          kind="authentication_error"))
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class AccessLog:
    """One JSON object per request once its answer has been sent (a stream: at its end):
    time, client, method, path, status, ms, and for a generation its id and usage."""

    def __init__(self, app, log: Log):
        self.app, self.log = app, log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]

        async def sent(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            self.log(_entry(scope, status[0], time.perf_counter() - t0))


def _entry(scope, status: int, seconds: float) -> dict:
    state = scope.get("state") or {}
    client = scope.get("client")
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "client": f"{client[0]}:{client[1]}" if client else None,
             "method": scope.get("method"), "path": scope.get("path"), "status": status,
             "ms": round(seconds * 1e3, 1)}
    if "request_id" in state:
        entry["id"] = state["request_id"]
    return entry | state.get("usage", {})
