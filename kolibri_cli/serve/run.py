"""`serve(load, config, ...)`: bind and listen, load the model and warm the worker up while the
app answers 503 ("Loading model", as llama-server does), run on uvicorn until SIGTERM or
Ctrl-C, then drain: no new connections, every request in flight (and in the queue) answered,
for at most `drain_s` seconds; the guard's timings are kept for the next run. Past `drain_s`,
or at a second SIGTERM or Ctrl-C, the requests still open end at once, each with an error (a
stream: an error event and `[DONE]`), never cut mid-stream.

The port opens at once (a port in use fails before anything loads): a first run that compiles
the kernel for a minute is a server that says so (503 on /health and every route but /version,
with Retry-After), not a closed port; a client or load balancer waits for /health's 200.
"""

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from kolibri_cli.decode.proposers import default_settings
from kolibri_cli.engine.config import generation_defaults
from kolibri_cli.errors import KolibriError
from kolibri_cli.serve.app import Api, Log, build
from kolibri_cli.serve.connections import bounded_protocol
from kolibri_cli.serve.metrics import Metrics
from kolibri_cli.serve.requests import Limits, Served
from kolibri_cli.serve.worker import PROPOSER, Worker

LOOPBACK = ("127.0.0.1", "::1", "localhost")
CONNECTIONS = 256  # open connections (beyond those the queue holds) before uvicorn answers 503
ENDING_S = 5.0  # past the drain, for the open requests to send their error and close


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (the URL given to on_ready says which)
    spec: bool = True
    api_key: str | None = None  # None: no key asked
    record: Path | None = None  # folder for golden traces of finished requests
    limits: Limits = field(default_factory=Limits)
    threads: int | None = None  # kernel threads (None: numba's default, every core)
    name: str | None = None  # the model id clients ask for (None: the model's name)
    drain_s: float = 60.0  # seconds SIGTERM waits for requests in flight


def exposure_note(host: str, api_key: str | None) -> str | None:
    """A warning for a server anyone on the network may use; None on loopback or with a key."""
    if host in LOOPBACK or api_key:
        return None
    return (f"note: listening on {host} without --api-key: anyone who reaches this port can use "
            "the model")


def serve(load: Callable[[Callable[[str], None]], object], cfg: ServeConfig,
          on_listening: Callable[[str], None], on_ready: Callable[[str, object], None], log: Log,
          note: Callable[[str], None]) -> None:
    """Serve until a signal; `on_listening(url)` once the port is open, `load(stage)` -> the
    model meanwhile (`stage(words)`: what it does now, for the 503's message), `on_ready(url,
    model)` once requests are answered, `log(entry)` per request, `note(line)` for what an
    operator should see (a recording that stopped, a bug). A load that fails stops the server
    and is raised here."""
    sock, url = _bind(cfg.host, cfg.port)
    api = Api(cfg.spec)
    server = _Server(uvicorn.Config(
        build(api, cfg.api_key, log), log_level="warning", access_log=False,
        lifespan="off", server_header=False, http=bounded_protocol(),
        timeout_graceful_shutdown=cfg.drain_s + ENDING_S,
        limit_concurrency=CONNECTIONS + cfg.limits.max_queue), api.abort, cfg.drain_s)
    start = _Start(load, cfg, api, server, note, lambda model: on_ready(url, model))
    try:
        sock.listen(server.config.backlog)
        on_listening(url)
        start.thread.start()
        server.run(sockets=[sock])
    finally:
        sock.close()
        start.end(note)
    if start.failed is not None:
        raise start.failed


class _Start:
    """The model loaded and the worker warmed up on a thread of their own, then handed to the
    app (`Api.ready`); a failure ends the server (`failed`, raised by `serve`)."""

    def __init__(self, load, cfg: ServeConfig, api: Api, server, note, on_ready):
        self.load, self.cfg, self.api, self.server = load, cfg, api, server
        self.note, self.on_ready = note, on_ready
        self.failed: BaseException | None = None
        self.worker: Worker | None = None
        self.record = None
        self.model = self.served = None
        self.ended = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="kolibri-load", daemon=True)

    def _run(self) -> None:
        try:
            worker = self._worker(self.load(self._stage))
            worker.start()
        except BaseException as e:  # noqa: BLE001 - raised by serve(), in the main thread
            self.failed = e
            self.server.should_exit = True
            return
        with self.lock:
            if self.ended:  # stopped while it loaded: nobody will be served
                worker.stop()
                return
            self.worker = worker
            self.api.ready(self.served, worker, worker.metrics)
        self.on_ready(self.model)

    def _stage(self, words: str) -> None:
        self.api.stage = words

    def _worker(self, model) -> Worker:
        from kolibri_cli.goldens.log import GoldenLog

        self.api.stage = "warming the kernels up"
        self.model, cfg = model, self.cfg
        name = cfg.name or model.name
        self.served = Served(model, name, generation_defaults(model.path), cfg.limits)
        metrics = Metrics(name, default_settings(PROPOSER)[0])
        self.record = GoldenLog(cfg.record) if cfg.record else None
        return Worker(model, cfg.spec, cfg.limits.max_queue, metrics, cfg.threads, self.record,
                      self.note)

    def end(self, note) -> None:
        """After the server stopped: the worker (if it started) stopped, the recording closed,
        the guard's timings kept."""
        with self.lock:
            self.ended = True
            worker = self.worker
        if worker is not None:
            worker.cancel_all()  # after a full drain: nothing left to cancel
            worker.stop()
        if self.record is not None:
            self.record.close()
        if worker is not None:
            _keep_costs(worker, self.model, note)


class _Server(uvicorn.Server):
    """uvicorn's server, draining as kolibri does: a second signal (SIGTERM or Ctrl-C) ends
    the drain, and at its end `abort()` ends every open request with an error before uvicorn
    would cancel it (a traceback, a stream cut without its end)."""

    def __init__(self, config, abort: Callable[[], None], drain_s: float):
        super().__init__(config)
        self.abort, self.drain_s = abort, drain_s

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:
            self.force_exit = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        watch = asyncio.create_task(self._end_drain())
        try:
            await super().shutdown(sockets)
        finally:
            watch.cancel()
        await self._let_requests_end()

    async def _end_drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_s
        while not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self.abort()

    async def _let_requests_end(self) -> None:
        """After a forced end: the aborted requests' last events sent (a client that
        does not read them is cut, quietly)."""
        self.abort()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENDING_S
        while self.server_state.tasks and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.server_state.tasks:
            logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
            for task in self.server_state.tasks:
                task.cancel()


def _bind(host: str, port: int) -> tuple[socket.socket, str]:
    """A socket bound to (host, port), not yet listening, and the URL it will answer at."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, OverflowError) as e:
        raise KolibriError(f"--host {host!r} cannot be resolved ({e})") from None
    # proto as getaddrinfo gives it (IPPROTO_TCP): asyncio sets TCP_NODELAY only on such
    # sockets; with proto 0 every answer waited ~40 ms for the client's delayed ACK
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise KolibriError(f"cannot listen on {host} port {port} ({e.strerror}); pick another "
                           "--port (0: any free one)") from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return sock, f"http://{shown}:{bound_port}"


def _keep_costs(worker: Worker, model, note) -> None:
    """The guard's timings, for the next run of this kernel (as `kolibri generate` keeps them)."""
    if worker.drafting is not None:
        worker.drafting.keep(worker.costs, note)
