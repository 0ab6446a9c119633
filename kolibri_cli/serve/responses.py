"""The answers, as OpenAI shapes them: a completion or chat completion, and the chunks of a
stream (server-sent events, ending `data: [DONE]`).

Beyond OpenAI's fields: `usage` carries the request's speculation counts (worker.Usage),
`timings` llama.cpp's per-request figures (prompt_n/ms, predicted_n/ms, draft_n,
draft_n_accepted), and with `return_token_ids` the ids where vLLM puts them (completions:
`choices[0].prompt_token_ids` and `.token_ids`; chat: `prompt_token_ids` at the top and
`choices[0].token_ids`; streamed, the prompt's in the first chunk and each chunk's new ids).
"""

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

    @property
    def chat(self) -> bool:
        return self.ask.kind == "chat"

    def base(self, chunk: bool = False) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def answer(head: Head, result, usage) -> dict:
    """The whole answer of a request that did not stream."""
    choice = {"index": 0, "finish_reason": FINISH[result.stop_reason], "logprobs": None}
    if head.chat:
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
    body = head.base() | {"choices": [choice], "usage": usage.to_dict(),
                          "timings": timings(result, usage)}
    if head.ask.return_token_ids:
        choice["token_ids"] = result.output_ids
        _prompt_ids(head, body, choice, result.prompt_ids)
    return body


def chunk(head: Head, text: str, ids: list[int] | None = None, finish: str | None = None,
          first: bool = False) -> bytes:
    """One event of a stream: new text (chat: a delta; the first carries the role), its ids."""
    choice = {"index": 0, "finish_reason": FINISH.get(finish) if finish else None,
              "logprobs": None}
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


def usage_chunk(head: Head, result, usage) -> bytes:
    """stream_options.include_usage: the last event, no choices."""
    return event(head.base(chunk=True) | {"choices": [], "usage": usage.to_dict(),
                                          "timings": timings(result, usage)})


def timings(result, usage) -> dict:
    """llama.cpp's per-request figures, which kolibri's own client (servers.api) reads."""
    return {"prompt_n": usage.prompt_tokens, "prompt_ms": result.prefill_s * 1e3,
            "predicted_n": usage.completion_tokens, "predicted_ms": result.decode_s * 1e3,
            "draft_n": usage.draft_tokens, "draft_n_accepted": usage.accepted_tokens}


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _prompt_ids(head: Head, body: dict, choice: dict, ids: list[int]) -> None:
    if head.chat:
        body["prompt_token_ids"] = ids
    else:
        choice["prompt_token_ids"] = ids
