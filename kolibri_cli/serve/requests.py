"""OpenAI request bodies -> `Ask`, what one generation needs; every bad field an `ApiError`
(4xx, OpenAI's error body) naming it.

Read: `model`, `prompt` (completions: text, or token ids) or `messages` (chat: through the
model's chat template), `max_tokens` (or `max_completion_tokens`), `temperature`, `top_p`,
`top_k`, `min_p`, `repetition_penalty`, `seed`, `stop`, `stream`, `stream_options.include_usage`
`presence_penalty`, `frequency_penalty`, `n`, `logprobs` (chat: with `top_logprobs`) and vLLM's
`return_token_ids`. Sampling fields left out take the model's generation_config.json, else
greedy, as `kolibri generate` does. Fields that would change the answer in a way kolibri cannot
honour (best_of, echo, suffix, tools, logit_bias, a JSON response_format) are refused; any other
field is ignored.
"""

import math
from dataclasses import dataclass

import orjson

from kolibri_cli.decode.sampling import Sampling, new_seed
from kolibri_cli.engine.template import ChatTemplateError
from kolibri_cli.errors import KolibriError

MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 1000  # characters of one stop string
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
MAX_CHOICES = 16  # n: choices of one request (run one after the other)
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


class ApiError(Exception):
    """A request the server refuses: HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class Limits:
    max_tokens: int | None = None  # most new tokens a request may ask for (None: up to the
    # context); a chat's default too, cut to the room the prompt leaves
    max_body: int = 1 << 20  # bytes of one request body
    max_queue: int = 8  # requests waiting behind the running one; more are refused (503)


@dataclass(frozen=True)
class Served:
    """What requests are read against: the model, the id clients name it by, its sampling
    defaults (generation_config.json) and the server's limits."""

    model: object  # engine Model
    name: str
    defaults: dict
    limits: Limits


@dataclass(frozen=True)
class Ask:
    kind: str  # "chat" or "completion"
    prompt_ids: list[int]
    prompt: str  # the user's text (chat: the last user message), as traces record it
    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
    return_token_ids: bool = False
    n: int = 1  # choices, each sampled with its own seed (the request's + its index)
    logprobs: int | None = None  # None: none returned; k: each token's, and the k most likely


def parse_body(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def completion_ask(body: dict, served: Served) -> Ask:
    ids, text = _prompt(body.get("prompt"), served.model)
    return _ask("completion", body, served, ids, text, COMPLETION_DEFAULT_TOKENS)


def chat_ask(body: dict, served: Served) -> Ask:
    tok = served.model.tokenizer
    if tok.chat_template is None:
        raise ApiError(400, f"{served.name} has no chat template: use /v1/completions",
                       "messages")
    messages = _messages(body.get("messages"))
    try:
        ids = tok.encode_messages(messages)  # content's special-token text stays text
    except (ChatTemplateError, KolibriError) as e:
        raise ApiError(400, f"the chat template cannot render these messages: {e}",
                       "messages") from None
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    return _ask("chat", body, served, ids, user, served.limits.max_tokens or
                served.model.config.max_position_embeddings)


def _ask(kind: str, body: dict, served: Served, ids: list[int], text: str, default: int) -> Ask:
    _refuse_unsupported(body)
    _check_model(body, served.name)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    return Ask(kind, ids, text, _max_tokens(body, served, len(ids), default,
                                            "messages" if kind == "chat" else "prompt"),
               _sampling(body, served.defaults), _stops(body.get("stop")), stream,
               stream and _flag(options or {}, "include_usage"),
               _flag(body, "return_token_ids"), _choices(body),
               _chat_logprobs(body) if kind == "chat" else _completion_logprobs(body))


def _choices(body: dict) -> int:
    n = _integer(body, "n")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"n must be 1..{MAX_CHOICES}, got {n}", "n")
    return n or 1


def _chat_logprobs(body: dict) -> int | None:
    """Chat: `logprobs` true, with `top_logprobs` alternatives (0..20) per token."""
    top = _integer(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be 0..{MAX_TOP_LOGPROBS}, got {top}",
                       "top_logprobs")
    if not _flag(body, "logprobs"):
        if top:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return top or 0


def _completion_logprobs(body: dict) -> int | None:
    """Completions: `logprobs` k (0..20), the k most likely alternatives per token."""
    k = _integer(body, "logprobs")
    if k is not None and not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"logprobs must be 0..{MAX_TOP_LOGPROBS}, got {k}", "logprobs")
    return k


def _check_model(body: dict, name: str) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    if model is not None and model != name:
        raise ApiError(404, f"the model {str(model)[:100]!r} does not exist; this server runs "
                       f"{name!r} (GET /v1/models)", "model", "model_not_found",
                       "not_found_error")


_UNSUPPORTED = {  # field -> (value that means "off", why it is refused)
    "best_of": (1, "no server-side best-of (ask n choices)"),
    "echo": (False, "the prompt is not echoed"), "suffix": ("", "no suffix (insertion) mode"),
    "logit_bias": ({}, "no logit bias"), "tools": ([], "no tool calls"),
    "functions": ([], "no function calls"),
}


def _refuse_unsupported(body: dict) -> None:
    for key, (off, why) in _UNSUPPORTED.items():
        value = body.get(key)
        if value is not None and value != off:
            raise ApiError(400, f"{key}={str(value)[:60]} is not supported: {why}", key)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") in (None, "text")):
        raise ApiError(400, "response_format: only text is supported", "response_format")


def _prompt(value, model) -> tuple[list[int], str]:
    """(ids, text) of a completion prompt: text (encoded as `kolibri generate --raw` does), or
    token ids; a list holding one of those is taken as that one prompt."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise ApiError(400, "prompt is empty", "prompt")
        return _encode(model, value), value
    if isinstance(value, list) and value and all(_is_int(i) for i in value):
        vocab = model.config.vocab_size
        bad = next((i for i in value if not 0 <= i < vocab), None)
        if bad is not None:
            raise ApiError(400, f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})",
                           "prompt")
        return list(value), ""
    if isinstance(value, list) and len(value) > 1:
        raise ApiError(400, "one prompt per request (send the others separately)", "prompt")
    raise ApiError(400, "prompt must be a non-empty string or a list of token ids", "prompt")


def _encode(model, text: str) -> list[int]:
    try:
        return model.tokenizer.encode_nogil(text)
    except KolibriError as e:
        raise ApiError(400, str(e), "prompt") from None


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] needs a role (a string) and content", "messages")
        out.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return out


def _content(content, i: int) -> str:
    """A message's text: a string, the text parts of a list, or nothing (an assistant turn)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise ApiError(400, f"messages[{i}]: only text content parts are supported",
                           "messages")
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                   "messages")


def _max_tokens(body: dict, served: Served, prompt: int, default: int, param: str) -> int:
    """The request's cap on new tokens: asked (refused past the server's limit or the context),
    else `default` cut to the room the context leaves."""
    context = served.model.config.max_position_embeddings
    limit = served.limits.max_tokens or context
    if prompt >= context:
        raise ApiError(400, f"the prompt is {prompt} tokens; the model's context is {context}",
                       param, "context_length_exceeded")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else \
        "max_tokens"
    asked = _integer(body, key)
    if asked is None:
        return min(default, limit, context - prompt)
    if not 1 <= asked <= limit:
        raise ApiError(400, f"{key} must be 1..{limit} on this server, got {asked}", key)
    if prompt + asked > context:
        raise ApiError(400, f"{prompt} prompt tokens + {key} {asked} exceed the model's context "
                       f"({context})", key, "context_length_exceeded")
    return asked


def _sampling(body: dict, defaults: dict) -> Sampling:
    """The request's sampling fields over the model's defaults; a random seed when sampling
    without one."""
    given = {key: value for key, value in (
        ("temperature", _number(body, "temperature")), ("top_p", _number(body, "top_p")),
        ("min_p", _number(body, "min_p")),
        ("repetition_penalty", _number(body, "repetition_penalty")),
        ("presence_penalty", _number(body, "presence_penalty")),
        ("frequency_penalty", _number(body, "frequency_penalty")),
        ("top_k", _top_k(body)), ("seed", _integer(body, "seed"))) if value is not None}
    try:
        chosen = Sampling(**(defaults | given)).check(prefix="")
    except KolibriError as e:  # "top-k must be ...": the field's name as the API spells it
        name = str(e).split(" ", 1)[0]
        param = name.replace("-", "_")
        raise ApiError(400, param + str(e)[len(name):], param) from None
    if not chosen.greedy and "seed" not in given:
        return Sampling(**(defaults | given | {"seed": new_seed()}))
    return chosen


def _top_k(body: dict) -> int | None:
    k = _integer(body, "top_k")
    return 0 if k == -1 else k  # vLLM's "off"


def _stops(value) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(400, f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} "
                       "characters", "stop")
    return tuple(s for s in stops if s)


def _flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false", key)
    return bool(value)


def _number(body: dict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"{key} must be a number", key)
    return float(value)


def _integer(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise ApiError(400, f"{key} must be an integer", key)
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
