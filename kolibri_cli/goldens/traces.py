"""Logged chat traffic -> golden chains, through the model's tokenizer and chat template.

One JSON object a line, either an OpenAI chat request/response pair
`{"request": {"messages": [...], "max_tokens"?, "temperature"?, ...}, "response": {"choices":
[{"message": {"content"}, "finish_reason"}], "model"?}}` — a streamed response as its chunks
(`choices[0].delta`), a list of chunk objects or the SSE text (`data: {...}` lines) — or a
conversation that ends with the answer `{"messages": [..., {"role": "assistant", "content"}]}`;
optional top-level "id" and "category". The prompt is the conversation before the answer
rendered with the chat template; the answer is re-tokenized (an eos id appended when it ended
naturally), so chains are marked `retokenized`: the server may have split the same text into
other tokens. The request's sampling parameters are kept in the golden's `sampling` (the server
sampled by its own rule: kolibri cannot replay the chain, only count drafts against it).
Non-goals: tool calls, images (their parts are refused, not dropped).
"""

import json
import os
import stat
from pathlib import Path

from kolibri_cli.engine.template import ChatTemplateError
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, kept_sampling
from kolibri_cli.goldens.stream import text_lines
from kolibri_cli.text import shown


def import_traces(path: str | Path, model, category: str = "traces") -> list[Golden]:
    """Every trace in the JSONL file `path` as a golden of `model` (its tokenizer and template)."""
    path = Path(path)
    if not model.tokenizer.has_chat_template:  # the tokenizer's own message advises --raw
        raise KolibriError(f"{model.name} has no chat template: traces are rendered with it; "
                           "import them with a chat model")
    goldens, seen = [], set()
    for lineno, line in _lines(path):
        golden = _golden(_object(line, f"{path}:{lineno}"), model, category, lineno,
                         f"{path}:{lineno}")
        if str(golden.id) in seen:  # 1 and "1" are one row in a report
            raise KolibriError(f"{path}:{lineno}: duplicate id {golden.id!r}")
        seen.add(str(golden.id))
        goldens.append(golden)
    if not goldens:
        raise KolibriError(f"{path}: no traces in the file (it is empty)")
    return goldens


def _lines(path: Path):
    """(line number, text) of each non-blank line, read a block at a time (a 1 GB file is never
    held whole; a line is at most KOLIBRI_MAX_LINE_MB). A FIFO is read like a file; a device
    (/dev/zero never ends) or a socket is refused."""
    _check_kind(path)
    try:
        with open(path, "rb") as f:
            for lineno, raw in text_lines(f, path):
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise KolibriError(f"{path}:{lineno}: not UTF-8 text (byte {e.start} of the "
                                       "line); the traces file must be UTF-8") from None
    except OSError as e:
        raise KolibriError(f"{path}: cannot read the traces file ({e.strerror})") from None


def _check_kind(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise KolibriError(f"{path}: traces file not found") from None
    except OSError as e:
        raise KolibriError(f"{path}: cannot read the traces file ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise KolibriError(f"{path}: is a folder, expected a traces file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise KolibriError(f"{path}: is a device or socket, expected a traces file")


def _object(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise KolibriError(f"{where}: not JSON ({e.msg})") from None
    except RecursionError:
        raise KolibriError(f"{where}: JSON nested ~1,000 levels deep; a trace is a request "
                           "and its response") from None
    except ValueError:  # Python's int limit
        raise KolibriError(f"{where}: a number of more than 4,300 digits") from None
    if not isinstance(obj, dict):
        raise KolibriError(f"{where}: expected a JSON object")
    return obj


# The most text a trace's prompt (its messages, each counted with MARKUP characters for the
# template's turn markers) or its answer may hold: a million tokens or so, past any model's
# context. Tokenizing costs ~160 bytes of memory a character (a 12 MB answer took 1.9 GB), so
# without it a 64 MB line could take 10 GB.
MAX_TEXT = 1 << 22
MARKUP = 64


def _golden(obj: dict, model, category: str, lineno: int, where: str) -> Golden:
    messages, answer, finish, meta = _conversation(obj, where)
    for what, size in ((f"prompt ({MARKUP} a message for its markup)",
                        sum(len(m["content"]) + MARKUP for m in messages)),
                       ("answer", len(answer))):
        if size > MAX_TEXT:
            raise KolibriError(f"{where}: the {what} is {size:,} characters, more than "
                               f"{MAX_TEXT:,}: past any model's context")
    tok = model.tokenizer
    try:
        prompt_ids = tok.encode_messages(messages)
    except ChatTemplateError as e:  # its hint (generate's --raw) is no option of an import
        raise KolibriError(f"{where}: {e.reason}") from None
    output_ids = tok.encode(answer, add_special_tokens=False)
    if finish == "stop" and model.eos_ids:
        output_ids.append(model.eos_ids[0])
    if not output_ids:
        raise KolibriError(f"{where}: the answer is empty")
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    sampling = _sampling(obj.get("request"), where)
    reference = {"engine": "import", "retokenized": True, **meta}
    identity = model.identity
    return Golden(obj.get("id", lineno), str(obj.get("category", category)), user, True,
                  prompt_ids, output_ids, model.name, identity.model_sha256, reference,
                  list(model.eos_ids), sampling, identity=identity.to_dict())


# the request fields a golden's `sampling` keeps (OpenAI's, and vLLM's and llama.cpp's extras)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")


def _sampling(request, where: str) -> dict:
    """The request's sampling parameters as a golden keeps them ({}: greedy, or none named); a
    sampled request that named no seed is kept without one (unseeded: not seed 0, which no
    run used)."""
    if not isinstance(request, dict):
        return {}
    given = {k: request[k] for k in SAMPLING_FIELDS if request.get(k) is not None}
    if given.get("top_k") == -1:  # vLLM's "off"
        given["top_k"] = 0
    try:
        return kept_sampling(given)
    except KolibriError as e:
        raise KolibriError(f"{where}: the request's {e}") from None


def sampled_share(goldens: list[Golden]) -> tuple[int, int, int]:
    """(sampled goldens, of them unseeded, goldens whose request named no temperature: the
    server's default)."""
    sampled = sum(1 for g in goldens if not g.sampler.greedy)
    unseeded = sum(1 for g in goldens if g.unseeded)
    unsaid = sum(1 for g in goldens if "temperature" not in g.reference.get("request_sampling",
                                                                          {"temperature": 0}))
    return sampled, unseeded, unsaid


def _conversation(obj: dict, where: str) -> tuple[list[dict], str, str, dict]:
    """(messages before the answer, the answer's text, finish reason, reference extras)."""
    if "request" in obj:
        request, response = obj.get("request"), obj.get("response")
        if not isinstance(request, dict) or not isinstance(response, dict | list | str):
            raise KolibriError(f"{where}: 'request' must be an object and 'response' an object, "
                               "a list of streamed chunks or their SSE text")
        messages = _messages(request.get("messages"), where)
        answer, finish, served = _answer(obj.get("response"), where)
        meta = {k: v for k, v in (("served_model", served),
                                  ("max_tokens", _max_tokens(request, where))) if v is not None}
        meta["request_sampling"] = {k: request[k] for k in SAMPLING_FIELDS if k in request}
        return messages, answer, finish or "stop", meta
    messages = _messages(obj.get("messages"), where)
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise KolibriError(f"{where}: 'messages' must end with the assistant's answer")
    return messages[:-1], messages[-1]["content"], "stop", {}


def _max_tokens(request: dict, where: str) -> int | None:
    """The request's max_tokens, kept in the golden's reference: a whole number 1..2^31-1 (a
    server refuses anything else; -5 and 1e30 were written into goldens)."""
    value = request.get("max_tokens")
    if value is None:
        return None
    if type(value) is not int or not 1 <= value < 2**31:
        raise KolibriError(f"{where}: request.max_tokens must be a whole number from 1 to "
                           f"2^31-1, got {shown(value)}")
    return value


def _answer(response, where: str) -> tuple[str, str | None, str | None]:
    """(text, finish reason, served model) of a response: whole, or streamed (its chunks)."""
    if isinstance(response, dict) and "message" in ((response.get("choices") or [{}])[0] or {}):
        choice = response["choices"][0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise KolibriError(f"{where}: the response has no choices[0].message")
        return (_text(choice["message"].get("content"), where), choice.get("finish_reason"),
                response.get("model"))
    chunks = _sse_chunks(response, where) if isinstance(response, str) else (
        response if isinstance(response, list) else [response])
    text, finish, served = [], None, None
    for chunk in chunks:
        choice = (chunk.get("choices") or [None])[0] if isinstance(chunk, dict) else None
        if not isinstance(choice, dict) or not isinstance(choice.get("delta", {}), dict):
            if isinstance(chunk, dict) and not chunk.get("choices"):  # usage-only last chunk
                continue
            raise KolibriError(f"{where}: the response has no choices[0].message, nor streamed "
                               "chunks with choices[0].delta")
        if (piece := choice.get("delta", {}).get("content")) is not None:
            text.append(_text(piece, where))
        finish = choice.get("finish_reason") or finish
        served = chunk.get("model") or served
    if not chunks or (not text and finish is None):
        raise KolibriError(f"{where}: the response has no choices[0].message, nor streamed "
                           "chunks with choices[0].delta")
    return "".join(text), finish, served


def _sse_chunks(text: str, where: str) -> list:
    """The JSON chunks of a server-sent-events stream (`data: {...}` lines, `data: [DONE]`)."""
    chunks = []
    for line in text.splitlines():
        data = line.removeprefix("data:").strip() if line.startswith("data:") else None
        if data and data != "[DONE]":
            chunks.append(_object(data, f"{where} (streamed response)"))
    return chunks


def _messages(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise KolibriError(f"{where}: no 'messages' list")
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise KolibriError(f"{where}: every message needs a 'role' and 'content'")
        out.append({"role": m["role"], "content": _text(m.get("content"), where)})
    return out


def _text(content, where: str) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return _valid(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" for p in content):
            raise KolibriError(f"{where}: only text content is supported (found "
                               f"{sorted({str(p.get('type')) for p in content})})")
        return _valid("".join(str(p.get("text", "")) for p in content), where)
    raise KolibriError(f"{where}: a message's 'content' must be text")


def _valid(text: str, where: str) -> str:
    """JSON can spell a lone surrogate (\\ud800), which no tokenizer or UTF-8 file can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise KolibriError(f"{where}: a message's text holds a lone surrogate (not valid "
                           "Unicode); fix the trace") from None
    return text


def served_elsewhere(goldens: list[Golden], model_name: str) -> list[str]:
    """The served models named in the traces that are not `model_name` (compared by the last
    part of the name, case aside: "HuggingFaceTB/SmolLM2-135M-Instruct" is
    "smollm2-135m-instruct")."""
    def base(name: str) -> str:
        return name.rsplit("/", 1)[-1].lower()

    served = dict.fromkeys(str(g.reference["served_model"]) for g in goldens
                           if g.reference.get("served_model") is not None)
    return [s for s in served if base(s) != base(model_name)]
