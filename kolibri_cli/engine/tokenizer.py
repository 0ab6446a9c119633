"""Text <-> ids with the checkpoint's tokenizer.json, and chat templates rendered like transformers.

The chat template is rendered with jinja2 exactly as transformers' `apply_chat_template` does
(engine/template.py: the sandbox, with bounds on time, memory and output; the named special
tokens that are set, `tools`/`documents` None). Non-goals: tool calling.
"""

import json
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

from kolibri_cli.engine import template
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import printable

# transformers passes these to the template when the tokenizer config sets them (and only then).
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


@contextmanager
def _rust_errors(what: str):
    """The tokenizers library raises bare Exceptions, and pyo3's PanicException — a
    BaseException that `except Exception` misses — when its Rust code panics: both are one
    KolibriError; Ctrl-C and exits pass."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit, KolibriError):
        raise
    except BaseException as e:
        raise KolibriError(f"{what} ({printable(str(e), 160)})") from None


class Tokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        with _rust_errors(f"{folder}/tokenizer.json: cannot be read"):
            self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        self.config = _read_config(folder / "tokenizer_config.json")
        self.chat_template = _chat_template(folder, self.config)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def ordinary_ids(self, n_rows: int) -> list[int]:
        """Ids of ordinary text tokens: below both the embedding's row count and the
        tokenizer's vocabulary (higher rows are padding), not an added/special token."""
        added = set(self._tok.get_added_tokens_decoder())
        return [i for i in range(min(n_rows, self.vocab_size)) if i not in added]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with _rust_errors("the tokenizer cannot encode the text"):
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        with _rust_errors("the tokenizer cannot decode the ids"):
            return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

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
        return template.compile_template(self.chat_template)

    def render_chat(self, user_message: str, system: str | None = None) -> str:
        """One user turn (after an optional system message) + generation prompt."""
        system_turn = [] if system is None else [{"role": "system", "content": system}]
        return self.render_messages([*system_turn, {"role": "user", "content": user_message}])

    def render_messages(self, messages: list[dict]) -> str:
        """A conversation [{"role", "content"}, ...] + generation prompt, as transformers'
        apply_chat_template renders it (a system message replaces the template's default)."""
        if not self.chat_template:
            raise template.ChatTemplateError("this model has no chat template")
        return template.render(
            self._template,
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **self.special_tokens(),
        )

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
    except OSError as e:
        raise KolibriError(f"{path}: cannot be read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:  # JSON, UTF-8, 4300+ digit ints, deep nesting
        raise KolibriError(f"{path}: not valid JSON ({printable(str(e), 120)})") from None
    if not isinstance(cfg, dict):
        raise KolibriError(f"{path}: not a JSON object")
    return cfg


def _chat_template(folder: Path, config: dict) -> str | None:
    """chat_template.jinja (transformers >= 4.43 saves it beside the config, and it wins), else
    the config's chat_template: a string, or named templates of which "default" is taken."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise KolibriError(f"{jinja}: cannot be read as UTF-8 text ({e})") from None
    found = config.get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found
                 if isinstance(t, dict) and isinstance(t.get("name"), str)}
        found = named.get("default")
    if found is not None and not isinstance(found, str):
        raise KolibriError(f"{folder}/tokenizer_config.json: chat_template is not a string")
    return found
