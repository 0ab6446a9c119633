"""Which ASGI stack `kolibri serve` runs on: Starlette or FastAPI, each on uvicorn with its h11
or httptools protocol, serving the same completion-shaped endpoint to the same client.

    python probes/serve_stack.py [--requests 3000] [--streams 50] [--rounds 2]

Printed per stack: the import time of the framework and uvicorn (median of 5 fresh processes,
bare Python's start subtracted), the microseconds of one keep-alive JSON POST (a completion
request and answer, no model), and of one server-sent event (a stream of 200). A generation
takes milliseconds per token, so the figures are the per-request and per-token overhead the
stack adds; run it alone on the machine.
"""

import argparse
import http.client
import json
import subprocess
import sys
import time
from importlib.util import find_spec

APP = r'''
import socket, sys
import orjson
import uvicorn

ANSWER = {"id": "cmpl-x", "object": "text_completion", "choices": [{"index": 0,
          "text": "hello " * 20, "finish_reason": "length"}], "usage": {"prompt_tokens": 10,
          "completion_tokens": 20}}
EVENT = b"data: " + orjson.dumps({"choices": [{"text": "x", "index": 0}]}) + b"\n\n"

async def events():
    for _ in range(200):
        yield EVENT
    yield b"data: [DONE]\n\n"

if sys.argv[1] == "starlette":
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def completions(request):
        body = orjson.loads(await request.body())
        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(ANSWER)
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
else:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from pydantic import BaseModel, ConfigDict

    class Ask(BaseModel):  # the fields kolibri reads, validated by pydantic
        model_config = ConfigDict(extra="allow")
        prompt: str | list[int]
        max_tokens: int = 16
        temperature: float | None = None
        seed: int | None = None
        stop: str | list[str] | None = None
        stream: bool = False
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(ask: Ask):
        if ask.stream:
            return StreamingResponse(events(), media_type="text/event-stream")
        return ANSWER
# IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets (else ~40 ms a request)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                              http=sys.argv[2])).run(sockets=[sock])
'''
BODY = json.dumps({"model": "m", "prompt": "hello world " * 20, "max_tokens": 64,
                   "temperature": 0.0, "seed": 1, "stop": ["\n\n"]})
STREAM = json.dumps({"model": "m", "prompt": "hi", "stream": True})


def post_us(conn, body: str, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        conn.getresponse().read()
    return (time.perf_counter() - t0) / n * 1e6


def serve(framework: str, protocol: str, requests: int, streams: int) -> tuple[float, float]:
    proc = subprocess.Popen([sys.executable, "-c", APP, framework, protocol],
                            stdout=subprocess.PIPE, text=True)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", int(proc.stdout.readline()))
        post_us(conn, BODY, 200)  # warm-up
        return post_us(conn, BODY, requests), post_us(conn, STREAM, streams) / 201
    finally:
        proc.terminate()
        proc.wait()


def import_ms(module: str) -> float:
    def median_run(code: str) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - t0)
        return sorted(times)[2]
    return (median_run(f"import {module}, uvicorn") - median_run("pass")) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    protocols = ["h11"] + (["httptools"] if find_spec("httptools") else [])
    imports = {f: import_ms(m) for f, m in (("starlette", "starlette.applications"),
                                           ("fastapi", "fastapi"))}
    print(f"{'stack':22s} {'import ms':>9s} {'us/POST':>8s} {'us/event':>8s}")
    for r in range(a.rounds):
        for framework in ("starlette", "fastapi"):
            for protocol in protocols:
                post, event = serve(framework, protocol, a.requests, a.streams)
                print(f"{framework + ' + ' + protocol:22s} {imports[framework]:9.0f} "
                      f"{post:8.0f} {event:8.1f}   (round {r + 1} of {a.rounds})")


if __name__ == "__main__":
    main()
