"""POST /tokenize and /detokenize as llama-server shapes them, which kolibri's own client of a
deployment (engines/tokenizer.py) and llama.cpp's tools call.

/tokenize {content, add_special (false), parse_special (true), with_pieces (false)} ->
{tokens: [id, ...]}, or with pieces [{id, piece}, ...] (a piece that is not whole UTF-8 text is
its bytes, as a list of numbers); /detokenize {tokens} -> {content}, special tokens kept.
Non-goals: vLLM's {prompt}/{messages} form.
"""

from kolibri_cli.errors import KolibriError
from kolibri_cli.serve.requests import ApiError


def tokenize(body: dict, model) -> dict:
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "content must be a string", "content")
    add, special, pieces = (_flag(body, key, default) for key, default in (
        ("add_special", False), ("parse_special", True), ("with_pieces", False)))
    tok = model.tokenizer
    try:
        ids = tok.encode_nogil(content, add) if special else tok.encode_text(content, add)
    except KolibriError as e:
        raise ApiError(400, str(e), "content") from None
    if not pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": _piece(tok.token_bytes(i))} for i in ids]}


def detokenize(body: dict, model) -> dict:
    ids = body.get("tokens")
    vocab = model.config.vocab_size
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            and 0 <= i < vocab for i in ids):
        raise ApiError(400, f"tokens must be a list of token ids (0..{vocab - 1})", "tokens")
    try:
        return {"content": model.tokenizer.decode(ids, skip_special_tokens=False)}
    except KolibriError as e:
        raise ApiError(400, str(e), "tokens") from None


def _piece(data: bytes) -> str | list[int]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def _flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false", key)
    return value
