"""The ASGI app (Starlette): routes, the bearer key, the body limit, the access log.

GET /health, /version, /metrics, /v1/models(/{id}); POST /tokenize, /detokenize (tokens.py),
/v1/completions and /v1/chat/completions, streamed (server-sent events) or not. A request is
read and checked here (requests.py), queued for the worker (worker.py) — refused with 503 at
once when the queue is full — and answered as its ids arrive; a client that disconnects cancels
its generation; at shutdown past the drain (`Api.abort`) the open ones end with an error. Every
failure is a JSON error body in OpenAI's shape with a 4xx status (a kolibri bug: 500), and the
server goes on.
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
from kolibri_cli.serve import responses, tokens
from kolibri_cli.serve.requests import ApiError, Served, chat_ask, completion_ask, parse_body
from kolibri_cli.serve.worker import Busy, Job

Log = Callable[[dict], None]
BODY_S = 60.0  # a body a megabyte long takes milliseconds; a slow one holds a connection
CLOSED = ApiError(499, "the client closed the request", kind="cancelled")  # nginx's 499
SHUTDOWN = ApiError(503, "the server shut down before this request finished (past its "
                    "--drain-timeout, or stopped twice)", code="server_shutdown",
                    kind="server_error")


class Api:
    """The state the routes share: what is served, the worker, the metrics — None until
    `ready` (the model loads meanwhile, and `Loading` answers 503 saying `stage`)."""

    def __init__(self, spec: bool):
        self.spec = spec
        self.served: Served | None = None
        self.worker = self.metrics = None
        self.stage = "loading the model"  # what the 503 says the server is doing
        self.started = int(time.time())
        # tokenizing a body near --max-body takes a second or more: done on this one thread,
        # the event loop goes on streaming the running request and answering the others
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="kolibri-read")
        self.live: set[asyncio.Queue] = set()  # the event queues of requests being answered
        self.reading: set[asyncio.Timeout] = set()  # the deadlines of bodies being read
        self.ended = False  # the drain is over: a request not yet answering is refused

    def ready(self, served: Served, worker, metrics) -> None:
        """The model is loaded and the worker warm: requests are answered from now on."""
        self.worker, self.metrics = worker, metrics
        self.served = served  # last: the routes answer once it is set

    def abort(self) -> None:
        """The drain is over: every request still open ends now, with an error (on the event
        loop's thread); a body still arriving is refused at once (its deadline brought
        forward), and one read meanwhile is refused before it is queued."""
        self.ended = True
        for events in self.live:
            events.put_nowait(("shutdown", None))
        for deadline in self.reading:
            deadline.reschedule(asyncio.get_running_loop().time())
        if self.worker is not None:
            self.worker.cancel_all()

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def version(self, request: Request) -> Response:
        from kolibri_cli import __version__

        return JSONResponse({"version": __version__, "engine": "kolibri"})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=_metrics_type())

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id}: the one model, or 404 (`client.models.retrieve`)."""
        if request.path_params["model"] != self.served.name:
            return error(ApiError(404, f"the model {request.path_params['model'][:100]!r} does "
                                  f"not exist; this server runs {self.served.name!r}", "model",
                                  "model_not_found", "not_found_error"))
        return JSONResponse(self._model())

    def _model(self) -> dict:
        return {"id": self.served.name, "object": "model", "created": self.started,
                "owned_by": "kolibri",
                "max_model_len": self.served.model.config.max_position_embeddings}

    async def tokenize(self, request: Request) -> Response:
        """llama-server's POST /tokenize: {content, add_special, parse_special, with_pieces}."""
        return await self._read(request, lambda body: tokens.tokenize(body, self.served.model))

    async def detokenize(self, request: Request) -> Response:
        """llama-server's POST /detokenize: {tokens} -> {content}."""
        return await self._read(request, lambda body: tokens.detokenize(body, self.served.model))

    async def _read(self, request: Request, answer) -> Response:
        """A body read and answered on the reader thread (tokenizing a megabyte takes a
        second): the answer's JSON, or the refusal."""
        try:
            raw = await self._body(request)
            return JSONResponse(await asyncio.get_running_loop().run_in_executor(
                self.reader, lambda: answer(parse_body(raw))))
        except ApiError as e:
            return self._refused(request, e)
        except ClientDisconnect:
            return error(CLOSED)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, completion_ask, "cmpl")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat_ask, "chatcmpl")

    async def _generate(self, request: Request, parse, prefix: str) -> Response:
        try:
            raw = await self._body(request)
            ask = await asyncio.get_running_loop().run_in_executor(
                self.reader, lambda: parse(parse_body(raw), self.served))
            if self.ended:  # parsed after the drain ended: nothing will answer it
                raise _shutdown()
        except ApiError as e:
            return self._refused(request, e)
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
        head = responses.Head(rid, int(time.time()), self.served.name, ask,
                              self.served.model.tokenizer.token_bytes)
        self.live.add(events)
        if ask.stream:
            tokenizer = self.served.model.tokenizer
            return StreamingResponse(_stream(request, job, events, head, tokenizer, self.live),
                                     media_type="text/event-stream",
                                     headers={"X-Request-Id": rid, "Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        try:
            return await _whole(request, job, events, head)
        finally:
            self.live.discard(events)


    async def _body(self, request: Request) -> bytes:
        """The body (`_body`), refused with SHUTDOWN if the drain ends before it is all in."""
        limit = self.served.limits.max_body
        try:
            async with asyncio.timeout(BODY_S) as deadline:
                self.reading.add(deadline)
                try:
                    return await _body(request, limit)
                finally:
                    self.reading.discard(deadline)
        except TimeoutError:
            if self.ended:
                raise _shutdown() from None
            raise ApiError(408, f"the request body took longer than {BODY_S:g} s to arrive"
                           ) from None

    def _refused(self, request: Request, e: ApiError) -> Response:
        """A request refused before it was queued; a body left unread (413, 408, the server
        ending) leaves the connection in no state to reuse."""
        ending = e.code == SHUTDOWN.code
        if ending:
            request.state.error = SHUTDOWN.code
        else:
            self.metrics.count("invalid")
        closes = e.status in (408, 413) or ending
        return error(e, {"Connection": "close"} if closes else None)


def _shutdown() -> ApiError:
    """SHUTDOWN, raised (a new instance: a raised one keeps its traceback)."""
    return ApiError(SHUTDOWN.status, SHUTDOWN.message, code=SHUTDOWN.code, kind=SHUTDOWN.kind)


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
                results, usage = value
                _note_usage(request, results, usage)
                return JSONResponse(responses.answer(head, results, usage),
                                    headers={"X-Request-Id": job.id})
            if kind == "error":
                return error(value)
            if kind == "shutdown":
                request.state.error = SHUTDOWN.code
                return error(SHUTDOWN)
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
                  tokenizer, live: set):
    """The stream's events; closed early (the client left), it cancels the generation. A
    stream that cannot finish (an error, the server shutting down) ends with an error event
    and `[DONE]`, as vLLM's do, and the access log names the error."""
    n = head.ask.n
    texts = [TextDeltas(tokenizer, head.ask.stop) for _ in range(n)]
    first = [True] * n  # choice i's first event not sent yet
    try:
        if head.chat:
            for i in range(n):
                yield responses.chunk(head, "", first=True, index=i)
            first = [False] * n
        while True:
            kind, value = await events.get()
            if kind == "tokens":
                i = value.index
                text = texts[i].add(value.ids)
                if text or head.ask.return_token_ids or first[i] or value.logprobs:
                    yield responses.chunk(head, text, value.ids, first=first[i], index=i,
                                          rows=value.logprobs)
                    first[i] = False
            elif kind == "done":
                results, usage = value
                _note_usage(request, results, usage)
                for i, result in enumerate(results):
                    yield responses.chunk(head, texts[i].finish(), [], result.stop_reason,
                                          first[i], index=i)
                if head.ask.include_usage:
                    yield responses.usage_chunk(head, results, usage)
                yield responses.DONE
                return
            elif kind == "cancelled":  # its client is gone: nothing reads this
                return
            else:  # "error" or "shutdown"
                failure = value if kind == "error" else SHUTDOWN
                request.state.error = failure.code or failure.kind
                yield responses.event(failure.body())
                yield responses.DONE
                return
    finally:
        live.discard(events)
        job.cancel()


def _note_usage(request: Request, results: list, usage) -> None:
    """What the access log adds for a generation (its first choice's finish)."""
    request.state.usage = usage.to_dict() | {"finish_reason": results[0].stop_reason,
                                             "mode": results[0].mode}


async def _body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes before it is all read (the caller bounds
    the time it may take)."""
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
        Route("/v1/models/{model:path}", api.model),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error,
                                                       Exception: _bug})
    return AccessLog(BearerKey(Loading(app, api), key), log)


class Loading:
    """Until the model is ready (`Api.ready`), every route but /version answers 503 with
    llama-server's "Loading model" error and Retry-After: /health too, so a client, a load
    balancer or `kolibri probe --engine` waits for its 200 (engines.transport retries a 503)."""

    def __init__(self, app, api: Api):
        self.app, self.api = app, api

    async def __call__(self, scope, receive, send) -> None:
        if self.api.served is None and scope["type"] == "http" and scope["path"] != "/version":
            response = error(ApiError(503, f"Loading model: {self.api.stage}; retry shortly",
                                      code="model_loading", kind="unavailable_error"),
                             {"Retry-After": "1"})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


class BearerKey:
    """With a key, /v1/ routes, /tokenize and /detokenize answer 401 unless `Authorization:
    Bearer KEY` (compared in constant time); /health, /version and /metrics stay open, as
    vLLM's do."""

    def __init__(self, app, key: str | None):
        self.app, self.expected = app, f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send) -> None:
        if (self.expected is not None and scope["type"] == "http"
                and scope["path"].startswith(("/v1/", "/tokenize", "/detokenize"))):
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
    if "error" in state:  # a stream's status is sent before it ends: what ended it
        entry["error"] = state["error"]
    return entry | state.get("usage", {})
