"""A multi-turn conversation on one kept KV cache: the history lives in the chat template, each
turn re-renders it, and only the tokens past the common prefix are prefilled. The generators
see the whole conversation as their prompt, so the n-gram proposer drafts from earlier turns.
Non-goals: the terminal (cli/chat.py), tool calls, editing past turns.
"""

from collections.abc import Sequence

from kolibri_cli.decode.generate import GenerationResult, KVState, generate_plain, generate_spec
from kolibri_cli.decode.sampling import GREEDY, Sampling
from kolibri_cli.errors import KolibriError


class Conversation:
    def __init__(self, model, system: str | None = None):
        if model.tokenizer.chat_template is None:
            raise KolibriError(f"{model.name} has no chat template: kolibri chat needs one")
        self.model, self.system = model, system
        self.messages: list[dict] = []
        self.kv = KVState(model.transformer.new_cache())

    @property
    def context(self) -> int:
        return self.kv.cache.max_len

    def reset(self) -> None:
        """Forget the history (the cache keeps the system prompt's prefix, if any)."""
        self.messages = []

    def set_system(self, text: str | None) -> None:
        """The system message of the turns to come (None: the template's default); the history
        stays, and the next turn prefills from where the rendering first differs."""
        self.system = text

    def prompt_ids(self, user_text: str) -> list[int]:
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        turns = [*system, *self.messages, {"role": "user", "content": user_text}]
        return self.model.tokenizer.encode_messages(turns)

    def reply(self, user_text: str, max_tokens: int, proposer=None, sampling: Sampling = GREEDY,
              stop: Sequence[str] = (), on_tokens=None) -> GenerationResult:
        """Answer one user turn and add both to the history. On Ctrl-C the partial answer (what
        was streamed) joins the history and KeyboardInterrupt propagates."""
        ids = self.prompt_ids(user_text)
        room = self.context - len(ids)
        if room < 1:
            raise KolibriError(f"the conversation ({len(ids)} tokens) fills the context "
                               f"({self.context}): /reset to start over")
        seen: list[int] = []

        def emit(new: list[int]) -> None:
            seen.extend(new)
            if on_tokens is not None:
                on_tokens(new)

        how = dict(sampling=sampling, stop=stop, kv=self.kv)
        try:
            if proposer is None:
                result = generate_plain(self.model, ids, min(max_tokens, room), emit, **how)
            else:
                result = generate_spec(self.model, ids, min(max_tokens, room), proposer, emit,
                                       **how)
        except KeyboardInterrupt:
            self._add(user_text, self.model.tokenizer.decode(seen))
            raise
        self._add(user_text, result.text)
        return result

    def _add(self, user_text: str, answer: str) -> None:
        self.messages += [{"role": "user", "content": user_text},
                          {"role": "assistant", "content": answer}]
