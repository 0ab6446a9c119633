"""A hostile inference server on 127.0.0.1 for tests: each route answers as a broken or malicious
server would (redirects elsewhere, wrong shapes, endless or dripping bodies), and every request
it gets is recorded with its headers, so a test can prove where the API key went."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MB = 1 << 20


class HostileServer:
    """`routes[(method, path)]` = answer(handler) writing the whole response; unknown routes are
    404. `requests` holds (method, path, headers) of every request received."""

    def __init__(self, routes: dict | None = None):
        self.routes = dict(routes or {})
        self.requests: list[tuple[str, str, dict]] = []
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.body = json.loads(self.rfile.read(length)) if length else {}
                server.requests.append((self.command, self.path, dict(self.headers)))
                answer = server.routes.get((self.command, self.path)) or json_answer(
                    {"error": "no such route"}, 404)
                try:
                    answer(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what a deadline or a byte cap does

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _head(handler, status: int, headers: dict) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()


def json_answer(obj, status: int = 200):
    """A complete JSON answer (`obj` as bytes is sent as it is)."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()

    def answer(handler):
        _head(handler, status, {"Content-Length": str(len(data))})
        handler.wfile.write(data)
    return answer


def redirect(status: int, location: str):
    def answer(handler):
        _head(handler, status, {"Location": location, "Content-Length": "0"})
    return answer


def endless(total: int = 1 << 30, block: bytes = b"1, " * (MB // 3)):
    """`total` bytes of `{"tokens": [1, 1, ...` without a length, streamed block by block (never
    held whole on either side), until done or the client hangs up."""
    def answer(handler):
        _head(handler, 200, {"Content-Type": "application/json"})
        handler.wfile.write(b'{"tokens": [')
        sent = 0
        while sent < total:
            handler.wfile.write(block)
            sent += len(block)
        handler.wfile.write(b"1]}")
    return answer


def drip(server: HostileServer, every: float = 2.0):
    """A valid-looking answer of one byte every `every` seconds: each read gets something, the
    whole never comes."""
    def answer(handler):
        _head(handler, 200, {"Content-Length": str(MB)})
        while not server.stop.wait(every):
            handler.wfile.write(b" ")
            handler.wfile.flush()
    return answer


def deep(levels: int) -> bytes:
    return b'{"tokens": ' + b"[" * levels + b"1" + b"]" * levels + b"}"


def completion(tokens, timings: dict | None = None, **extra) -> dict:
    """llama.cpp's /completion answer for `tokens` (top-2 logprobs for each)."""
    timings = {"predicted_ms": 10.0, "predicted_n": len(tokens)} if timings is None else timings
    probs = [{"id": t, "top_logprobs": [{"id": t, "logprob": -0.1}, {"id": 3, "logprob": -2.0}]}
             for t in tokens if isinstance(t, int)]
    return {"tokens": tokens, "stop_type": "limit", "timings": timings,
            "completion_probabilities": probs} | extra


PROPS = {"default_generation_settings": {}, "build_info": "b1-hostile", "model_path": "m.gguf"}


def waited(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
