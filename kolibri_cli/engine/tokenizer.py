"""Text <-> ids with the checkpoint's tokenizer.json, and chat templates rendered like transformers.

The chat template is rendered with jinja2 exactly as transformers' `apply_chat_template` does
(sandboxed environment, trim_blocks + lstrip_blocks, loopcontrols, `raise_exception`, the named
special tokens that are set, `tools`/`documents` None). Non-goals: tool calling.
"""

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

from kolibri_cli.errors import KolibriError

# transformers passes these to the template when the tokenizer config sets them (and only then).
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


class Tokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        try:
            self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise KolibriError(f"{folder}/tokenizer.json: cannot be read ({e})") from None
        self.config = _read_config(folder / "tokenizer_config.json")
        self.chat_template = self.config.get("chat_template")
        # transformers >= 4.43 saves the template beside the config, and that file wins.
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            self.chat_template = jinja.read_text(encoding="utf-8")
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in self.chat_template}
            self.chat_template = named.get("default")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise KolibriError(f"{folder}/tokenizer_config.json: chat_template is not a string")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def ordinary_ids(self, n_rows: int) -> list[int]:
        """Ids of ordinary text tokens: below both the embedding's row count and the
        tokenizer's vocabulary (higher rows are padding), not an added/special token."""
        added = set(self._tok.get_added_tokens_decoder())
        return [i for i in range(min(n_rows, self.vocab_size)) if i not in added]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def special_tokens(self) -> dict[str, str]:
        """The named special tokens the config sets, as transformers' special_tokens_map."""
        out = {}
        for key in _SPECIAL_TOKEN_KEYS:
            tok = self.config.get(key)
            tok = tok.get("content") if isinstance(tok, dict) else tok
            if tok is not None:
                out[key] = str(tok)
        return out

    @cached_property
    def _template(self):
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise KolibriError(f"chat template: {message}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except TemplateError as e:
            raise KolibriError(f"the chat template does not parse ({e}); use --raw") from None

    def render_chat(self, user_message: str, system: str | None = None) -> str:
        """One user turn (after an optional system message) + generation prompt."""
        system_turn = [] if system is None else [{"role": "system", "content": system}]
        return self.render_messages([*system_turn, {"role": "user", "content": user_message}])

    def render_messages(self, messages: list[dict]) -> str:
        """A conversation [{"role", "content"}, ...] + generation prompt, as transformers'
        apply_chat_template renders it (a system message replaces the template's default)."""
        from jinja2 import TemplateError

        if not self.chat_template:
            raise KolibriError("this model has no chat template; use --raw")
        try:
            return self._template.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self.special_tokens(),
            )
        except (TemplateError, TypeError, ValueError) as e:
            raise KolibriError(f"the chat template failed to render ({e}); use --raw") from None

    def encode_prompt(self, prompt: str, chat: bool, system: str | None = None) -> list[int]:
        """Chat: the rendered template carries its own special tokens, so none are added."""
        if chat:
            return self.encode(self.render_chat(prompt, system), add_special_tokens=False)
        if system is not None:
            raise KolibriError("a system message needs the chat template (drop --raw)")
        return self.encode(prompt)


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KolibriError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise KolibriError(f"{path}: not a JSON object")
    return cfg
