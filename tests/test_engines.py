"""The server clients against scripted HTTP stubs: retries, errors, the API key, and how each API's
answers become ids, timings and draft counters. (The real llama-server: test_llama_server.py.)"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kolibri_cli.decode.sampling import Sampling
from kolibri_cli.engines import connect
from kolibri_cli.engines.api import LlamaCppApi, OpenAiApi, VllmApi, _metric_sum, detect_api
from kolibri_cli.engines.transport import Http, masked
from kolibri_cli.errors import KolibriError


class Stub:
    """A scripted server on 127.0.0.1: `routes[(method, path)]` is a list of (status, body)
    answered in turn (the last one repeats); every request is recorded."""

    def __init__(self, routes: dict):
        self.routes = {key: list(answers) for key, answers in routes.items()}
        self.requests: list[tuple[str, str, dict, dict]] = []  # method, path, headers, body
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                stub.requests.append((self.command, self.path, dict(self.headers), body))
                answers = stub.routes.get((self.command, self.path)) or [(404, {"error": "no"})]
                status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    made = []

    def make(routes: dict) -> Stub:
        made.append(Stub(routes))
        return made[-1]

    yield make
    for s in made:
        s.close()


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# ---- transport ----------------------------------------------------------------------------


def test_busy_answers_are_retried_then_succeed(stub):
    s = stub({("GET", "/x"): [(503, {"error": {"message": "Loading model"}}), (429, {}),
                              (200, {"ok": 1})]})
    assert Http(s.url, backoff=0.01).get("/x") == {"ok": 1}
    assert len(s.requests) == 3


def test_server_down_is_one_clear_line_after_the_retries():
    with pytest.raises(KolibriError) as e:
        Http(closed_port_url(), retries=2, backoff=0.01).get("/health")
    msg = str(e.value)
    assert "connection refused" in msg and "tried 3 times" in msg and "\n" not in msg


def test_still_busy_after_every_retry_names_the_status(stub):
    s = stub({("GET", "/x"): [(503, {"error": {"message": "Loading model"}})]})
    with pytest.raises(KolibriError, match=r"HTTP 503: Loading model \(tried 2 times\)"):
        Http(s.url, retries=1, backoff=0.01).get("/x")


@pytest.mark.parametrize("status, body, expected", [
    (404, {"error": "x"}, "HTTP 404, no such endpoint"),
    (400, {"error": {"message": "the request exceeds the available context size"}},
     "HTTP 400: the request exceeds the available context size"),
    (200, b"<html>hello</html>", "the answer is not JSON"),
])
def test_unexpected_answers_fail_at_once(stub, status, body, expected):
    s = stub({("POST", "/completion"): [(status, body)]})
    with pytest.raises(KolibriError, match=expected):
        Http(s.url, backoff=0.01).post("/completion", {})
    assert len(s.requests) == 1


def test_the_api_key_is_sent_but_never_shown(stub, monkeypatch):
    monkeypatch.setenv("KOLIBRI_API_KEY", "sk-secret-123")
    s = stub({("GET", "/v1/models"): [(401, {"error": {"message": "bad key sk-secret-123"}})]})
    with pytest.raises(KolibriError) as e:
        Http(s.url).get("/v1/models")
    assert s.requests[0][2]["Authorization"] == "Bearer sk-secret-123"
    assert "KOLIBRI_API_KEY" in str(e.value)
    assert "sk-secret" not in str(e.value)


def test_openai_key_is_the_fallback(stub, monkeypatch):
    monkeypatch.delenv("KOLIBRI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    s = stub({("GET", "/v"): [(200, {})]})
    Http(s.url).get("/v")
    assert s.requests[0][2]["Authorization"] == "Bearer sk-openai"


def test_credentials_in_the_url_are_masked():
    assert masked("http://user:pw@host:8000/v1") == "http://***@host:8000/v1"
    assert masked("http://host:8000") == "http://host:8000"


def test_a_timeout_says_so(stub):
    import time

    s = stub({("GET", "/slow"): [(200, {})]})
    original = s.server.RequestHandlerClass._answer

    def slow(handler):
        time.sleep(0.5)
        original(handler)

    s.server.RequestHandlerClass.do_GET = slow
    with pytest.raises(KolibriError, match=r"no answer within 0.1 s"):
        Http(s.url, timeout=0.1).get("/slow")


# ---- APIs ---------------------------------------------------------------------------------


LLAMA_ANSWER = {"tokens": [5, 6, 2], "stop_type": "eos", "content": "ab",
                "timings": {"predicted_n": 3, "predicted_ms": 40.0, "draft_n": 4,
                            "draft_n_accepted": 1},
                "completion_probabilities": [
                    {"id": t, "top_logprobs": [{"id": t, "logprob": -0.1},
                                               {"id": 9, "logprob": -2.1}]} for t in (5, 6, 2)]}


def test_llamacpp_completion_sends_ids_and_reads_tokens_timings_counters(stub):
    s = stub({("POST", "/completion"): [(200, LLAMA_ANSWER)]})
    c = LlamaCppApi(Http(s.url)).complete([1, 2, 3], 8, Sampling(temperature=0.7, seed=42),
                                            margins=True)
    body = s.requests[0][3]
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 8 and body["return_tokens"]
    assert body["temperature"] == 0.7 and body["seed"] == 42 and body["n_probs"] == 2
    # llama.cpp's own filters (top_k 40, top_p 0.95, min_p 0.05) would apply unless set
    assert (body["top_k"], body["top_p"], body["min_p"], body["repeat_penalty"]) == (0, 1, 0, 1)
    assert c.output_ids == [5, 6, 2] and c.decode_s == pytest.approx(0.04)
    assert (c.drafted, c.accepted) == (4, 1)
    assert c.top2_margins == [2.0, 2.0, 2.0] and not c.retokenized


def test_sampling_settings_become_each_apis_request_fields():
    from kolibri_cli.engines.api import llamacpp_sampling, openai_sampling

    assert llamacpp_sampling(Sampling()) == {"temperature": 0.0, "repeat_penalty": 1.0}
    assert openai_sampling(Sampling()) == {"temperature": 0.0}
    sampled = Sampling(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                       seed=3)
    assert llamacpp_sampling(sampled) == {"temperature": 0.7, "top_k": 50, "top_p": 0.9,
                                          "min_p": 0.05, "repeat_penalty": 1.1, "seed": 3}
    assert openai_sampling(sampled) == {"temperature": 0.7, "seed": 3, "top_p": 0.9, "top_k": 50,
                                        "min_p": 0.05, "repetition_penalty": 1.1}
    assert openai_sampling(Sampling(temperature=1.0, seed=9)) == {"temperature": 1.0, "seed": 9}


def test_llamacpp_without_draft_counters_reports_zero(stub):
    answer = LLAMA_ANSWER | {"timings": {"predicted_ms": 10.0}}
    s = stub({("POST", "/completion"): [(200, answer)]})
    c = LlamaCppApi(Http(s.url)).complete([1], 3)
    assert (c.drafted, c.accepted) == (0, 0) and c.top2_margins == []


def test_llamacpp_answer_without_tokens_is_a_clear_error(stub):
    s = stub({("POST", "/completion"): [(200, {"content": "hi"})]})
    with pytest.raises(KolibriError, match=r"no list of token ids 'tokens' \(it has: content\)"):
        LlamaCppApi(Http(s.url)).complete([1], 3)


def test_detects_each_api(stub):
    llama = stub({("GET", "/props"): [(200, {"default_generation_settings": {}})]})
    vllm = stub({("GET", "/version"): [(200, {"version": "0.11.0"})]})
    other = stub({})
    assert [detect_api(Http(x.url)) for x in (llama, vllm, other)] == ["llama.cpp", "vllm",
                                                                        "openai"]


class TinyTokenizer:
    """Characters as ids (a=1, b=2, ...), enough to see re-tokenization."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i - 1) for i in ids)

    def encode(self, text, add_special_tokens=True):
        return [ord(ch) - ord("a") + 1 for ch in text]


def test_text_only_server_is_retokenized_and_timed_by_difference(stub):
    s = stub({("GET", "/v1/models"): [(200, {"data": [{"id": "m1"}]})],
              ("POST", "/v1/completions"): [
                  (200, {"choices": [{"text": "cab", "finish_reason": "stop"}]}),
                  (200, {"choices": [{"text": "c", "finish_reason": "length"}]})]})
    api = OpenAiApi(Http(s.url), TinyTokenizer(), eos_ids=(26,))
    c = api.complete([1, 2], 5)
    full, first = s.requests[1][3], s.requests[2][3]
    assert full == {"model": "m1", "prompt": "ab", "max_tokens": 5, "temperature": 0.0}
    assert first["max_tokens"] == 1
    assert c.output_ids == [3, 1, 2, 26] and c.retokenized and c.decode_s >= 0
    assert c.drafted is None


def test_vllm_ids_and_counters_from_metrics(stub):
    before = b'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 10.0\n' \
             b'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 4.0\n'
    after = b'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 25.0\n' \
            b'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 9.0\n'
    s = stub({("GET", "/metrics"): [(200, before), (200, after)],
              ("POST", "/v1/completions"): [
                  (200, {"choices": [{"text": "x", "token_ids": [7, 8, 2],
                                      "finish_reason": "stop"}]}),
                  (200, {"choices": [{"text": "x", "token_ids": [7]}]})]})
    api = VllmApi(Http(s.url), served_model="m")
    c = api.complete([1, 2, 3], 3)
    assert s.requests[1][3]["prompt"] == [1, 2, 3] and s.requests[1][3]["return_token_ids"]
    assert c.output_ids == [7, 8, 2] and (c.drafted, c.accepted) == (15, 5)


def test_vllm_without_token_ids_points_at_the_text_api(stub):
    s = stub({("GET", "/metrics"): [(404, {})],
              ("POST", "/v1/completions"): [(200, {"choices": [{"text": "x"}]})]})
    with pytest.raises(KolibriError, match="--engine-api openai"):
        VllmApi(Http(s.url), served_model="m").complete([1], 3)


def test_prometheus_counters_are_summed_over_labels():
    text = ('a_total{x="1"} 2\na_total{x="2"} 3.5\n# a_total 99\nab_total 7\n')
    assert _metric_sum(text, "a_total") == 5.5
    assert _metric_sum(text, "missing") is None


def test_connect_refuses_a_non_url():
    with pytest.raises(KolibriError, match="must start with http"):
        connect("localhost:8080")


def test_the_deadline_covers_the_retries(stub):
    import time

    s = stub({("GET", "/x"): [(503, {"error": {"message": "Loading model"}})]})
    t0 = time.monotonic()
    with pytest.raises(KolibriError, match=r"HTTP 503: Loading model \(tried [23] times\)"):
        Http(s.url, timeout=1.0, retries=10, backoff=0.4).get("/x")
    assert time.monotonic() - t0 < 5  # 10 retries with doubling backoff would take minutes
    assert len(s.requests) in (2, 3)  # at 0, 0.4 and 1.2 s: the third is past the deadline


@pytest.mark.parametrize("url, expected", [
    ("http://h:99999", "the port is not a number"), ("http://h/v1?x=1", "no ?query"),
    ("ftp://h", "must start with http"), ("http://:80", "names no host"),
    ("http://u:secret@h:x", "http://***@h:x"), ("http://[::1", "Invalid IPv6 URL"),
    ("http://a b:80", "spaces or control characters"), ("http://\x00h", "control characters"),
])
def test_engine_urls_are_exact_and_checked(url, expected):
    with pytest.raises(KolibriError) as e:
        Http(url)
    assert expected in str(e.value) and "secret" not in str(e.value)


@pytest.mark.parametrize("length, too_large", [("²", False), ("-5", False), ("1e9", False),
                                               ("99999999999999999999", True)])
def test_a_strange_content_length_is_read_to_the_close_or_refused(stub, length, too_large):
    """http.client parses Content-Length (a bad one: read to the close); one past the cap is
    refused before reading (`²` was a ValueError when kolibri parsed the header itself)."""
    s = stub({("GET", "/x"): [(200, {"ok": 1})]})
    original = s.server.RequestHandlerClass._answer

    def lying(handler):
        handler.send_header = lambda name, value, _send=handler.send_header: _send(
            name, length if name == "Content-Length" else value)
        original(handler)

    s.server.RequestHandlerClass.do_GET = lying
    if too_large:
        with pytest.raises(KolibriError, match="the answer is larger than 4.0 MB"):
            Http(s.url, retries=0).get("/x")
    else:
        assert Http(s.url, retries=0).get("/x") == {"ok": 1}
