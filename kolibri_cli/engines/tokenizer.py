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
Every request goes through the transport (engines/transport.py) and its policy, its answer read
up to a cap sized by what was sent and checked field by field (engines/answers.py) before use.
Non-goals: tool calls and images in chat messages.
"""

import json
from pathlib import Path

import numpy as np

from kolibri_cli.engine.model import Identity, TokenizerOnly
from kolibri_cli.engine.tokenizer import encode_prompt
from kolibri_cli.engines.answers import Answer, answer
from kolibri_cli.engines.api import ServerApi
from kolibri_cli.engines.transport import BODY_BYTES, Http
from kolibri_cli.errors import KolibriError

PROBE_TEXT = "kolibri"  # tokenized once up front: a server that cannot tokenize fails at once
SAMPLE_TRIES = 50  # candidate ids tried per ordinary id wanted (most of a vocabulary is)


class LlamaCppTokenizer:
    """llama-server's /tokenize, /detokenize and /apply-template."""

    def __init__(self, http: Http, props: Answer, vocab: int | None = None):
        self.http, self.vocab = http, vocab
        self.has_chat_template = bool(props.text("chat_template", limit=None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._encode(text, add_special_tokens, parse_special=True)

    def _encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        return _ids(self.http, "/tokenize", body, _text_bytes(text), self.vocab)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return _text(self.http, "/detokenize", {"tokens": list(ids)}, _ids_bytes(ids), "content")

    def encode_messages(self, messages: list[dict]) -> list[int]:
        body = {"messages": messages}
        prompt = _text(self.http, "/apply-template", body, _text_bytes(json.dumps(body)),
                       "prompt")
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

    def __init__(self, http: Http, vocab: int | None = None):
        self.http, self.vocab = http, vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        body = {"prompt": text, "add_special_tokens": add_special_tokens}
        return _ids(self.http, "/tokenize", body, _text_bytes(text), self.vocab)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        got = answer(self.http.post("/detokenize", {"tokens": list(ids)},
                                    max_bytes=_ids_bytes(ids)), self.http.where("/detokenize"))
        return _required(got, "prompt" if got.has("prompt") else "text")

    def encode_messages(self, messages: list[dict]) -> list[int]:
        body = {"messages": messages, "add_generation_prompt": True, "add_special_tokens": False}
        try:
            return _ids(self.http, "/tokenize", body, _text_bytes(json.dumps(body)), self.vocab)
        except KolibriError as e:
            if " HTTP 4" not in f" {e}":
                raise
            raise KolibriError(f"{self.http.where('/tokenize')} does not render chat messages "
                               "(SGLang's takes text only): pass --model with the served model's "
                               "tokenizer files or GGUF to render its chat template here") from None

    def encode_prompt(self, prompt: str, chat: bool, system: str | None = None) -> list[int]:
        return encode_prompt(self, prompt, chat, system)

    def sample_ordinary(self, n_rows: int, k: int, seed: int) -> list[int]:
        raise KolibriError(f"{self.http.where('')}: only a llama.cpp server's tokenizer can say "
                           "which ids are ordinary text; pass --model")


def server_model(api: ServerApi) -> TokenizerOnly:
    """The model `api`'s server runs, with the server's own tokenizer; a server that cannot
    tokenize is one error line."""
    props = _props(api) if api.api == "llama.cpp" else answer({}, api.url)
    info = _first_model(api.http)
    meta = info.object("meta") if info is not None else None
    vocab = meta.count("n_vocab") if meta is not None else None
    tokenizer = LlamaCppTokenizer(api.http, props, vocab or None) if api.api == "llama.cpp" \
        else OpenAiTokenizer(api.http)
    _check_tokenizes(tokenizer, api)
    slot = props.object("default_generation_settings")
    context = (slot.count("n_ctx") if slot is not None else None) or \
        (info.count("max_model_len") if info is not None else None)
    identity = server_identity(api, props, info)
    return TokenizerOnly(
        name=identity.served_model or api.url, tokenizer=tokenizer, vocab_size=vocab or None,
        context=context or None, eos_ids=_eos_ids(api, tokenizer, props), identity=identity)


def server_identity(api: ServerApi, props: Answer | None = None,
                    info: Answer | None = None) -> Identity:
    """The server's name for its model and, where it reports one, a fingerprint of its weights:
    llama.cpp its type, parameter count and file size; SGLang its weight_version. `props` and
    `info` (llama.cpp's /props, /v1/models' first entry): where already asked for."""
    if api.api == "llama.cpp":
        props = props or _props(api)
        name, path = props.text("model_alias"), props.text("model_path")
        if not name or name == path:  # no alias: the file's name, not where this host keeps it
            name = Path(path or "").name
        info = info if info is not None else _first_model(api.http)
        meta = info.object("meta") if info is not None else None
        return Identity(served_model=name, fingerprint=_llamacpp_fingerprint(meta))
    got = _optional(api.http, "/get_model_info")
    version = got.text("weight_version") if got is not None else None
    return Identity(served_model=str(getattr(api, "served_model", "") or ""),
                    fingerprint=f"weight_version {version}" if version else "")


def _llamacpp_fingerprint(meta: Answer | None) -> str:
    if meta is None or not meta.count("n_params") or not meta.count("size"):
        return ""
    ftype = meta.text("ftype")
    return f"llama.cpp {ftype + ', ' if ftype else ''}{meta.count('n_params')} parameters, " \
        f"{meta.count('size')} bytes"


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


def _eos_ids(api: ServerApi, tokenizer, props: Answer) -> tuple[int, ...]:
    """The id of the eos token the server names (llama.cpp: /props; vLLM: /tokenizer_info)."""
    token = props.text("eos_token")
    if token is None and api.api != "llama.cpp":
        info = _optional(api.http, "/tokenizer_info")
        eos = info.get("eos_token") if info is not None else None
        token = eos.get("content") if isinstance(eos, dict) else eos
    if not isinstance(token, str) or not token:
        return ()
    ids = tokenizer.encode(token, add_special_tokens=False)
    return (ids[0],) if len(ids) == 1 else ()


def _props(api: ServerApi) -> Answer:
    return answer(api.http.get("/props"), api.http.where("/props"))


def _first_model(http: Http) -> Answer | None:
    """/v1/models' first entry (None where the server lists none)."""
    got = _optional(http, "/v1/models")
    models = got.objects("data") if got is not None else []
    return models[0] if models else None


def _optional(http: Http, path: str) -> Answer | None:
    """GET `path`, or None where the server does not have it."""
    try:
        got = http.get(path, timeout=min(http.timeout, 30.0))
    except KolibriError as e:
        if "HTTP 404" in str(e) or "HTTP 405" in str(e) or "not JSON" in str(e):
            return None
        raise
    return answer(got, http.where(path)) if isinstance(got, dict) else None


def _ids(http: Http, path: str, body: dict, max_bytes: int, vocab: int | None) -> list[int]:
    """POST and read the answer's "tokens": token ids below `vocab` ([] for no text)."""
    got = answer(http.post(path, body, max_bytes=max_bytes), http.where(path))
    return [] if got.get("tokens") == [] else got.ids("tokens", vocab)


def _text(http: Http, path: str, body: dict, max_bytes: int, key: str) -> str:
    got = answer(http.post(path, body, max_bytes=max_bytes), http.where(path))
    return _required(got, key)


def _required(got: Answer, key: str) -> str:
    text = got.text(key, limit=None)
    if text is None:
        raise KolibriError(f"{got.where}: the answer has no text {key!r}")
    return text


def _text_bytes(text: str) -> int:
    """An answer's cap for `text` tokenized or rendered: each character at most one id of up to
    ~12 JSON bytes, or a few escaped bytes."""
    return BODY_BYTES + 16 * len(text)


def _ids_bytes(ids: list[int]) -> int:
    """An answer's cap for `ids` as text: a token's piece, escaped, is rarely 64 bytes."""
    return BODY_BYTES + 64 * len(ids)
