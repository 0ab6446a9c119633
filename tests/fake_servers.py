"""Small inference servers on 127.0.0.1 (Python's http.server) that answer as vLLM, SGLang or
llama.cpp do on the endpoints kolibri uses, with a real tokenizer behind them: the tokenizer,
chat-template and completion endpoints, the model list. Their completions are a fixed rule (the
prompt's last ids, cycled), not a model: enough to drive every command that records, imports or
measures through a server, in milliseconds. The real llama-server: tests/test_llama_server.py."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTEXT = 8192


def continuation(prompt_ids: list[int], n: int) -> list[int]:
    """The 'model': the prompt's last 7 ids, cycled, n of them."""
    tail = list(prompt_ids[-7:])
    return [tail[i % len(tail)] for i in range(n)]


class FakeServer:
    """`routes[(method, path)](body) -> (status, answer)`; every request is recorded."""

    def __init__(self, routes: dict):
        self.routes = routes
        self.requests: list[tuple[str, str, dict]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                fake.requests.append((self.command, self.path, body))
                route = fake.routes.get((self.command, self.path))
                status, answer = route(body) if route else (404, {"error": "Not Found"})
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
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

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def vllm(tokenizer, name: str = "smollm2-135m-instruct", eos: str | None = "<|im_end|>",
         sglang: bool = False) -> FakeServer:
    """vLLM's /tokenize (text or chat messages), /detokenize, /v1/models, /v1/completions with
    token ids and /metrics; `eos` served by /tokenizer_info (None: that endpoint is off).
    `sglang`: SGLang's flavour: /tokenize takes text only, /detokenize answers "text",
    /get_model_info reports a weight_version, and /version is not there."""

    def tokenize(body):
        if "messages" in body:
            if sglang:
                return 422, {"detail": [{"msg": "Field required", "loc": ["body", "prompt"]}]}
            ids = tokenizer.encode_messages(body["messages"])
        else:
            ids = tokenizer.encode(body["prompt"], body.get("add_special_tokens", True))
        return 200, {"tokens": ids, "count": len(ids), "max_model_len": CONTEXT}

    def detokenize(body):
        return 200, {"text" if sglang else "prompt": tokenizer.decode(body["tokens"], False)}

    def complete(body):
        prompt = body["prompt"]  # ids (vLLM's API), or text (the OpenAI one re-tokenizes)
        prompt = prompt if isinstance(prompt, list) else tokenizer.encode(prompt, False)
        ids = continuation(prompt, body["max_tokens"])
        choice = {"index": 0, "text": tokenizer.decode(ids), "finish_reason": "length"}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        return 200, {"model": name, "choices": [choice]}

    metrics = (b"vllm:spec_decode_num_draft_tokens_total 0\n"
               b"vllm:spec_decode_num_accepted_tokens_total 0\n")
    routes = {
        ("GET", "/v1/models"): lambda _: (200, {"object": "list", "data": [
            {"id": name, "root": f"/models/{name}", "max_model_len": CONTEXT}]}),
        ("POST", "/tokenize"): tokenize,
        ("POST", "/detokenize"): detokenize,
        ("POST", "/v1/completions"): complete,
        ("GET", "/metrics"): lambda _: (200, metrics),
    }
    if sglang:
        routes[("GET", "/get_model_info")] = lambda _: (200, {
            "model_path": name, "is_generation": True, "weight_version": "v7"})
    else:
        routes[("GET", "/version")] = lambda _: (200, {"version": "0.11.0"})
    if eos is not None and not sglang:
        routes[("GET", "/tokenizer_info")] = lambda _: (200, {
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos})
    return FakeServer(routes)


def openai_only(name: str = "gpt-x") -> FakeServer:
    """An OpenAI-compatible server with no tokenizer endpoint."""
    return FakeServer({("GET", "/v1/models"): lambda _: (200, {"data": [{"id": name}]})})


def prompt_ms(evaluated: int) -> float:
    """The fake llama-server's prompt evaluation time: c(n) = (4 + n) / 5 by prompt evaluation."""
    return 4.0 + evaluated


def llamacpp(tokenizer, gguf_name: str = "SmolLM2-135M-Instruct.Q4_1.gguf",
             vocab: int = 49152) -> FakeServer:
    """llama-server's /props (chat template, eos token, slot context), /v1/models (vocabulary,
    parameter count, file size), /tokenize, /detokenize, /apply-template and /completion (one
    slot's prompt cache: `cache_prompt` evaluates only what follows the cached prefix, timed by
    prompt_ms)."""
    cached: list[int] = []  # the slot's prompt cache

    def tokenize(body):
        return 200, {"tokens": tokenizer.encode(body["content"], body.get("add_special", False))}

    def complete(body):
        prompt = body["prompt"]
        kept = 0
        if body.get("cache_prompt"):
            while kept < min(len(prompt) - 1, len(cached)) and prompt[kept] == cached[kept]:
                kept += 1  # as llama.cpp, the last prompt token is always evaluated
        cached[:] = prompt
        ids = continuation(prompt, body["n_predict"])
        evaluated = len(prompt) - kept
        return 200, {"tokens": ids, "content": tokenizer.decode(ids), "stop_type": "limit",
                     "timings": {"prompt_n": evaluated, "prompt_ms": prompt_ms(evaluated),
                                 "predicted_n": len(ids), "predicted_ms": 1.0 * len(ids)}}

    props = {"default_generation_settings": {"n_ctx": 4096}, "model_alias": f"/m/{gguf_name}",
             "model_path": f"/m/{gguf_name}", "model_ftype": "Q4_1", "build_info": "b1-fake",
             "chat_template": tokenizer.chat_template, "eos_token": "<|im_end|>"}
    meta = {"n_vocab": vocab, "n_params": 134515008, "size": 96576768, "ftype": "Q4_1"}
    return FakeServer({
        ("GET", "/props"): lambda _: (200, props),
        ("GET", "/v1/models"): lambda _: (200, {"data": [{"id": gguf_name, "meta": meta}]}),
        ("POST", "/tokenize"): tokenize,
        ("POST", "/detokenize"): lambda b: (200, {"content": tokenizer.decode(b["tokens"], False)}),
        ("POST", "/apply-template"): lambda b: (200, {
            "prompt": tokenizer.render_messages(b["messages"])}),
        ("POST", "/completion"): complete,
    })
