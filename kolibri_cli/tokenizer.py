"""Text <-> ids with the checkpoint's tokenizer.json, and chat templates rendered like transformers.

The chat template is rendered with jinja2 exactly as transformers' `apply_chat_template` does
(sandboxed environment, trim_blocks + lstrip_blocks, loopcontrols, `raise_exception`).
"""

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

from kolibri_cli.errors import KolibriError


class Tokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise KolibriError(f"{folder}/tokenizer.json: cannot be read ({e})") from None
        cfg_path = folder / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template = self.config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _special(self, key: str) -> str:
        tok = self.config.get(key)
        return tok.get("content", "") if isinstance(tok, dict) else (tok or "")

    @cached_property
    def _template(self):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise KolibriError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)

    def render_chat(self, user_message: str) -> str:
        """One user turn + generation prompt, as transformers' apply_chat_template renders it."""
        if not self.chat_template:
            raise KolibriError("this model has no chat template; use --raw")
        return self._template.render(
            messages=[{"role": "user", "content": user_message}],
            add_generation_prompt=True,
            bos_token=self._special("bos_token"),
            eos_token=self._special("eos_token"),
        )

    def encode_prompt(self, prompt: str, chat: bool) -> list[int]:
        """Chat: the rendered template carries its own special tokens, so none are added."""
        if chat:
            return self.encode(self.render_chat(prompt), add_special_tokens=False)
        return self.encode(prompt)
