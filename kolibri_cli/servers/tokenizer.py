"""A server's own tokenizer and chat template, over HTTP: prompt ids exactly as the server makes
them, for a model whose files are not on this machine; and the model a server runs, known by that
tokenizer and by what the server reports of it (its name, size, context, end-of-sequence token).

- llama.cpp (llama-server): POST /tokenize {content, add_special, parse_special} -> {tokens},
  /detokenize {tokens} -> {content}, /apply-template {messages} -> {prompt} (its chat template,
  the generation prompt added); GET /props (chat template, eos token, the slot's context) and
  /v1/models (vocabulary size, parameter count and file size: the fingerprint).
- vLLM: POST /tokenize {prompt, add_special_tokens} or {messages, add_generation_prompt} (its
  own chat template) -> {tokens, max_model_len}, /detokenize {tokens} -> {prompt}; the eos token
  from GET /tokenizer_info where it is enabled (--enable-tokenizer-info-endpoint).
- SGLang: /tokenize {prompt, add_special_tokens} as vLLM, /detokenize -> {text}; it takes no chat
  messages (a chat prompt needs --model); GET /get_model_info's weight_version, where set, is
  the fingerprint.
- any other OpenAI-compatible server has no tokenizer endpoint: refused with one line.
Every request goes through the transport (servers/transport.py) and its policy; every answer is
checked before it is used. Non-goals: tool calls and images in chat messages.
"""

from pathlib import Path

import numpy as np

from kolibri_cli.engine.model import Identity, TokenizerOnly
from kolibri_cli.engine.tokenizer import encode_prompt
from kolibri_cli.errors import KolibriError
from kolibri_cli.servers.api import ServerApi
from kolibri_cli.servers.transport import Http
from kolibri_cli.text import shown

PROBE_TEXT = "kolibri"  # tokenized once up front: a server that cannot tokenize fails at once
SAMPLE_TRIES = 50  # candidate ids tried per ordinary id wanted (most of a vocabulary is)


class LlamaCppTokenizer:
    """llama-server's /tokenize, /detokenize and /apply-template."""

    def __init__(self, http: Http, props: dict):
        self.http = http
        self.has_chat_template = bool(props.get("chat_template"))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._encode(text, add_special_tokens, parse_special=True)

    def _encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        return _ids(self.http.post("/tokenize", body), "tokens", self.http.where("/tokenize"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        answer = self.http.post("/detokenize", {"tokens": list(ids)})
        return _text(answer, "content", self.http.where("/detokenize"))

    def encode_messages(self, messages: list[dict]) -> list[int]:
        answer = self.http.post("/apply-template", {"messages": messages})
        prompt = _text(answer, "prompt", self.http.where("/apply-template"))
        return self.encode(prompt, add_special_tokens=False)

    def encode_prompt(self, prompt: str, chat: bool, system: str | None = None) -> list[int]:
        return encode_prompt(self, prompt, chat, system)

    def sample_ordinary(self, n_rows: int, k: int, seed: int) -> list[int]:
        """k distinct ids, drawn with `seed`, whose text tokenizes back to them with special
        tokens read as text: ordinary tokens (a control token's text splits into others)."""
        order = np.random.default_rng(seed).permutation(n_rows)
        found: list[int] = []
        for i in order[: k * SAMPLE_TRIES].tolist():
            if self._encode(self.decode([i]), False, parse_special=False) == [i]:
                found.append(i)
                if len(found) == k:
                    return found
        raise KolibriError(f"{self.http.where('/tokenize')}: fewer than {k} of "
                           f"{min(n_rows, k * SAMPLE_TRIES)} ids tried tokenize back to themselves")


class OpenAiTokenizer:
    """vLLM's /tokenize and /detokenize (chat messages rendered with its own template), and
    SGLang's, which take text only."""

    has_chat_template = True  # the server renders messages, or refuses to (SGLang)

    def __init__(self, http: Http):
        self.http = http

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        body = {"prompt": text, "add_special_tokens": add_special_tokens}
        return _ids(self.http.post("/tokenize", body), "tokens", self.http.where("/tokenize"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        answer = self.http.post("/detokenize", {"tokens": list(ids)})
        key = "prompt" if isinstance(answer, dict) and "prompt" in answer else "text"
        return _text(answer, key, self.http.where("/detokenize"))

    def encode_messages(self, messages: list[dict]) -> list[int]:
        body = {"messages": messages, "add_generation_prompt": True, "add_special_tokens": False}
        try:
            answer = self.http.post("/tokenize", body)
        except KolibriError as e:
            if " HTTP 4" not in f" {e}":
                raise
            raise KolibriError(f"{self.http.where('/tokenize')} does not render chat messages "
                               "(SGLang's takes text only): pass --model with the served model's "
                               "tokenizer files or GGUF to render its chat template here") from None
        return _ids(answer, "tokens", self.http.where("/tokenize"))

    def encode_prompt(self, prompt: str, chat: bool, system: str | None = None) -> list[int]:
        return encode_prompt(self, prompt, chat, system)

    def sample_ordinary(self, n_rows: int, k: int, seed: int) -> list[int]:
        raise KolibriError(f"{self.http.where('')}: only a llama.cpp server's tokenizer can say "
                           "which ids are ordinary text; pass --model")


def server_model(api: ServerApi) -> TokenizerOnly:
    """The model `api`'s server runs, with the server's own tokenizer; a server that cannot
    tokenize is one error line."""
    if api.api == "llama.cpp":
        props = _object(api.http.get("/props"), api.http.where("/props"))
        tokenizer = LlamaCppTokenizer(api.http, props)
    else:
        props, tokenizer = {}, OpenAiTokenizer(api.http)
    _check_tokenizes(tokenizer, api)
    info = _first_model(api.http)
    meta = info.get("meta") if isinstance(info.get("meta"), dict) else {}
    identity = server_identity(api, props, info)
    return TokenizerOnly(
        name=identity.served_model or api.url, tokenizer=tokenizer,
        vocab_size=_count(meta.get("n_vocab")),
        context=_count((props.get("default_generation_settings") or {}).get("n_ctx"))
        or _count(info.get("max_model_len")),
        eos_ids=_eos_ids(api, tokenizer, props), identity=identity)


def server_identity(api: ServerApi, props: dict | None = None,
                    info: dict | None = None) -> Identity:
    """The server's name for its model and, where it reports one, a fingerprint of its weights:
    llama.cpp its type, parameter count and file size; SGLang its weight_version. `props` and
    `info` (llama.cpp's /props, /v1/models' first entry): where already asked for."""
    if api.api == "llama.cpp":
        props = props or _object(api.http.get("/props"), api.http.where("/props"))
        name, path = props.get("model_alias"), props.get("model_path")
        if not name or name == path:  # no alias: the file's name, not where this host keeps it
            name = Path(str(path or "")).name
        meta = (info if info is not None else _first_model(api.http)).get("meta")
        return Identity(served_model=str(name or ""), fingerprint=_llamacpp_fingerprint(meta))
    info = _optional(api.http, "/get_model_info")
    version = info.get("weight_version") if info else None
    return Identity(served_model=str(getattr(api, "served_model", "") or ""),
                    fingerprint=f"weight_version {version}" if version else "")


def _llamacpp_fingerprint(meta) -> str:
    if not isinstance(meta, dict) or not all(_count(meta.get(k)) for k in ("n_params", "size")):
        return ""
    ftype = f"{meta['ftype']}, " if isinstance(meta.get("ftype"), str) else ""
    return f"llama.cpp {ftype}{meta['n_params']} parameters, {meta['size']} bytes"


def _check_tokenizes(tokenizer, api: ServerApi) -> None:
    """Tokenize a word: a server without a tokenizer endpoint fails here, in one line."""
    try:
        tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    except KolibriError as e:
        if "HTTP 404" not in str(e) and "HTTP 405" not in str(e):
            raise
        raise KolibriError(f"{api.url} cannot tokenize: it has no /tokenize endpoint (an OpenAI "
                           "API has none; llama.cpp, vLLM and SGLang do): pass --model with the "
                           "served model's tokenizer files or GGUF") from None


def _eos_ids(api: ServerApi, tokenizer, props: dict) -> tuple[int, ...]:
    """The id of the eos token the server names (llama.cpp: /props; vLLM: /tokenizer_info)."""
    token = props.get("eos_token")
    if token is None and api.api != "llama.cpp":
        token = (_optional(api.http, "/tokenizer_info") or {}).get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    if not isinstance(token, str) or not token:
        return ()
    ids = tokenizer.encode(token, add_special_tokens=False)
    return (ids[0],) if len(ids) == 1 else ()


def _first_model(http: Http) -> dict:
    """/v1/models' first entry ({} where the server lists none)."""
    answer = _optional(http, "/v1/models") or {}
    models = answer.get("data")
    return models[0] if isinstance(models, list) and models and isinstance(models[0], dict) \
        else {}


def _optional(http: Http, path: str) -> dict | None:
    """GET `path`, or None where the server does not have it."""
    try:
        answer = http.get(path, timeout=min(http.timeout, 30.0))
    except KolibriError as e:
        if "HTTP 404" in str(e) or "HTTP 405" in str(e) or "not JSON" in str(e):
            return None
        raise
    return answer if isinstance(answer, dict) else None


def _object(answer, where: str) -> dict:
    if not isinstance(answer, dict):
        raise KolibriError(f"{where}: the answer is not a JSON object")
    return answer


def _ids(answer, key: str, where: str) -> list[int]:
    ids = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise KolibriError(f"{where}: the answer has no list of token ids {key!r} "
                           f"(got {shown(answer, 80)})")
    return ids


def _text(answer, key: str, where: str) -> str:
    text = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(text, str):
        raise KolibriError(f"{where}: the answer has no text {key!r} (got {shown(answer, 80)})")
    return text


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 \
        else None
