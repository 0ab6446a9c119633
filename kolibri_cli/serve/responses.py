"""The answers, as OpenAI shapes them: a completion or chat completion, and the chunks of a
stream (server-sent events, ending `data: [DONE]`).

Beyond OpenAI's fields: `usage` carries the request's speculation counts (worker.Usage),
`timings` llama.cpp's per-request figures (prompt_n/ms, predicted_n/ms, draft_n,
draft_n_accepted), and with `return_token_ids` the ids where vLLM puts them (completions:
`choices[0].prompt_token_ids` and `.token_ids`; chat: `prompt_token_ids` at the top and
`choices[0].token_ids`; streamed, the prompt's in the first chunk and each chunk's new ids).
Logprobs in OpenAI's two shapes: chat `{"content": [{token, logprob, bytes, top_logprobs}]}`,
completions `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from kolibri_cli.serve.requests import Ask

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # kolibri -> OpenAI


@dataclass(frozen=True)
class Head:
    """What every object of one answer repeats."""

    id: str
    created: int
    model: str
    ask: Ask
    token_bytes: Callable[[int], bytes] | None = None  # for logprobs' token text

    @property
    def chat(self) -> bool:
        return self.ask.kind == "chat"

    def base(self, chunk: bool = False) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def answer(head: Head, results: list, usage) -> dict:
    """The whole answer of a request that did not stream: a choice per result."""
    choices = []
    for index, result in enumerate(results):
        choice = {"index": index, "finish_reason": FINISH[result.stop_reason],
                  "logprobs": logprobs(head, result.logprobs)}
        if head.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        choices.append(choice)
    body = head.base() | {"choices": choices, "usage": usage.to_dict(),
                          "timings": timings(results, usage)}
    if head.ask.return_token_ids:
        for choice, result in zip(choices, results, strict=True):
            choice["token_ids"] = result.output_ids
            _prompt_ids(head, body, choice, result.prompt_ids)
    return body


def chunk(head: Head, text: str, ids: list[int] | None = None, finish: str | None = None,
          first: bool = False, index: int = 0, rows: list | None = None) -> bytes:
    """One event of a stream: choice `index`'s new text (chat: a delta; the first carries the
    role), its ids, their logprobs rows."""
    choice = {"index": index, "finish_reason": FINISH.get(finish) if finish else None,
              "logprobs": logprobs(head, rows)}
    if head.chat:
        choice["delta"] = ({"role": "assistant", "content": text} if first else
                           {"content": text} if text or not finish else {})
    else:
        choice["text"] = text
    body = head.base(chunk=True) | {"choices": [choice]}
    if head.ask.return_token_ids:
        choice["token_ids"] = ids or []
        if first:
            _prompt_ids(head, body, choice, head.ask.prompt_ids)
    return event(body)


def logprobs(head: Head, rows: list | None) -> dict | None:
    """Rows (token, logprob, [(id, logprob)] of the top) in the request's kind's shape; None
    when not asked."""
    if rows is None or head.ask.logprobs is None:
        return None
    token = lambda i: _token_text(head.token_bytes(i))  # noqa: E731
    if head.chat:
        entry = lambda i, lp: {"token": token(i), "logprob": lp,  # noqa: E731
                               "bytes": list(head.token_bytes(i))}
        return {"content": [entry(i, lp) | {"top_logprobs": [entry(j, lq) for j, lq in top]}
                            for i, lp, top in rows]}
    texts = [token(i) for i, _, _ in rows]
    offsets = [sum(len(t) for t in texts[:k]) for k in range(len(texts))]
    return {"tokens": texts, "token_logprobs": [lp for _, lp, _ in rows],
            "top_logprobs": [_by_text(token, top) for _, _, top in rows],
            "text_offset": offsets}


def _by_text(token, top: list) -> dict:
    """Completions' {text: logprob}, most likely first; of tokens with the same text, the more
    likely one's."""
    out: dict[str, float] = {}
    for i, logprob in top:
        out.setdefault(token(i), logprob)
    return out


def _token_text(data: bytes) -> str:
    """A token's text; a piece of a character is written as its bytes (`bytes:\\xe2\\x80`, as
    vLLM writes it), so no two tokens share a key of completions' top_logprobs."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def usage_chunk(head: Head, results: list, usage) -> bytes:
    """stream_options.include_usage: the last event, no choices."""
    return event(head.base(chunk=True) | {"choices": [], "usage": usage.to_dict(),
                                          "timings": timings(results, usage)})


def timings(results: list, usage) -> dict:
    """llama.cpp's per-request figures, which kolibri's own client (engines.api) reads (over
    the choices: the first's prefill, every choice's decoding)."""
    return {"prompt_n": usage.prompt_tokens, "prompt_ms": results[0].prefill_s * 1e3,
            "predicted_n": usage.completion_tokens,
            "predicted_ms": sum(r.decode_s for r in results) * 1e3,
            "draft_n": usage.draft_tokens, "draft_n_accepted": usage.accepted_tokens}


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _prompt_ids(head: Head, body: dict, choice: dict, ids: list[int]) -> None:
    if head.chat:
        body["prompt_token_ids"] = ids
    else:
        choice["prompt_token_ids"] = ids
