"""Text <-> ids with the checkpoint's tokenizer.json, and chat templates rendered like transformers.

The chat template is rendered with jinja2 exactly as transformers' `apply_chat_template` does
(engine/template.py: the sandbox, with bounds on time, memory and output; the named special
tokens that are set, `tools`/`documents` None). `Tokenizes` is what commands that only tokenize
need of a tokenizer: this module's (files here) or a server's (engines/tokenizer.py).
Non-goals: tool calling.
"""

import os
import re
import sys
import tempfile
import threading
from contextlib import contextmanager
from functools import cache, cached_property
from pathlib import Path
from typing import Protocol

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
    KolibriError; Ctrl-C and exits pass. The panic's own text (Rust's hook writes it, with a
    backtrace, to fd 2 before the exception) is held back (`_panic_text_held`)."""
    try:
        with _panic_text_held():
            yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit, KolibriError):
        raise
    except BaseException as e:
        raise KolibriError(f"{what} ({printable(str(e), 160)})") from None


_PANIC = re.compile(rb"^thread '[^\n]*panicked at .*?(?:^note: [^\n]*\n|\Z)", re.M | re.S)
_held = {"depth": 0, "saved": -1, "file": None}  # fd 2 while Rust code runs, for every thread
_held_lock = threading.Lock()


@contextmanager
def _panic_text_held():
    """fd 2 into a private file while tokenizers' Rust code runs; what was written there goes
    on to the real stderr afterwards, a panic's text removed. Threads share the one redirection
    (the last one out restores it): another thread's log line is delayed, not lost."""
    if sys.stderr is not None:
        sys.stderr.flush()
    with _held_lock:
        if _held["depth"] == 0:
            try:
                _held["file"] = _held["file"] or tempfile.TemporaryFile()
                _held["saved"] = os.dup(2)
                os.dup2(_held["file"].fileno(), 2)
            except (OSError, ValueError):  # no fd 2 (a daemon): nothing to hold back
                _held["saved"] = -1
        _held["depth"] += 1
    try:
        yield
    finally:
        with _held_lock:
            _held["depth"] -= 1
            if _held["depth"] == 0 and _held["saved"] >= 0:
                os.dup2(_held["saved"], 2)
                os.close(_held["saved"])
                _held["saved"] = -1
                _pass_on(_held["file"])


def _pass_on(file) -> None:
    file.seek(0)
    text = _PANIC.sub(b"", file.read())
    file.seek(0)
    file.truncate()
    if text:
        os.write(2, text)


class Tokenizes(Protocol):
    """A tokenizer as the commands that only tokenize use it (goldens import and record, bench
    and the measured probe on a server)."""

    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def encode_messages(self, messages: list[dict]) -> list[int]: ...

    def encode_prompt(self, prompt: str, chat: bool, system: str | None = None) -> list[int]: ...

    def sample_ordinary(self, n_rows: int, k: int, seed: int) -> list[int]: ...


def encode_prompt(tok: Tokenizes, prompt: str, chat: bool, system: str | None) -> list[int]:
    """A prompt's ids: chat, one user turn (after an optional system message) through the chat
    template, whose text carries its own special tokens; raw, the text with the tokenizer's."""
    if chat:
        system_turn = [] if system is None else [{"role": "system", "content": system}]
        return tok.encode_messages([*system_turn, {"role": "user", "content": prompt}])
    if system is not None:
        raise KolibriError("a system message needs the chat template (drop --raw)")
    return tok.encode(prompt)


class Tokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        with _rust_errors(f"{folder}/tokenizer.json: cannot be read"):
            self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        self.config = _read_config(folder / "tokenizer_config.json")
        self.chat_template = _chat_template(folder, self.config)

    @classmethod
    def of(cls, tok, config: dict) -> "Tokenizer":
        """One made in memory (a GGUF's vocabulary): a `tokenizers.Tokenizer` and the
        tokenizer_config.json it would have (special tokens, chat_template)."""
        self = cls.__new__(cls)
        self._tok, self.config = tok, config
        self.chat_template = config.get("chat_template")
        return self

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def ordinary_ids(self, n_rows: int) -> list[int]:
        """Ids of ordinary text tokens: below both the embedding's row count and the
        tokenizer's vocabulary (higher rows are padding), not an added/special token."""
        added = set(self._tok.get_added_tokens_decoder())
        return [i for i in range(min(n_rows, self.vocab_size)) if i not in added]

    def sample_ordinary(self, n_rows: int, k: int, seed: int) -> list[int]:
        """k distinct ordinary ids, drawn with `seed`."""
        import numpy as np

        ordinary = np.asarray(self.ordinary_ids(n_rows), dtype=np.int64)
        if len(ordinary) < k:
            raise KolibriError(f"the vocabulary has {len(ordinary)} ordinary tokens, {k} needed")
        return np.random.default_rng(seed).choice(ordinary, k, replace=False).tolist()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with _rust_errors("the tokenizer cannot encode the text"):
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_nogil(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`encode`'s ids, other threads running meanwhile: tokenizers' encode holds the GIL
        (a second per megabyte), its encode_batch releases it. What a server encodes with."""
        with _rust_errors("the tokenizer cannot encode the text"):
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`text`'s ids with special tokens' text read as text (never a control id)."""
        with _rust_errors("the tokenizer cannot encode the text"):
            return self._as_text.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` stands for: a byte-level piece may be part of a character."""
        piece = self._tok.id_to_token(i)
        if i in self._tok.get_added_tokens_decoder() or piece is None:
            return self.decode([i], skip_special_tokens=False).encode("utf-8")
        if type(self._tok.decoder).__name__ == "ByteLevel":
            table = _byte_level_table()
            return bytes(table[ch] for ch in piece if ch in table)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])  # sentencepiece's byte fallback
        return self.decode([i], skip_special_tokens=False).encode("utf-8")

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

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """The rendered template carries its own special tokens, so none are added. A special
        token's text inside a message's content is text, never the control id: a user cannot
        end their turn and open a system one. Content without such text is encoded as it always
        was (the whole rendering at once); content with it is marked before rendering, and
        the rendering encoded piece by piece, the template's own special tokens as ids and the
        content's as text."""
        contents = [m["content"] for m in messages if isinstance(m.get("content"), str)]
        if not any(s in c for c in contents for s in self._special_strings):
            return self.encode_nogil(self.render_messages(messages), add_special_tokens=False)
        marks = _Marks(self._special_strings)
        text = self.render_messages([m | {"content": marks.hide(m["content"])}
                                     if isinstance(m.get("content"), str) else m
                                     for m in messages])
        return self._encode_marked(text, marks)

    def _encode_marked(self, text: str, marks: "_Marks") -> list[int]:
        """`text`'s ids: its special tokens as their ids, the marked ones as text."""
        ids: list[int] = []
        for i, piece in enumerate(marks.structural.split(text)):
            if i % 2:  # a special token the template wrote
                ids.append(self._tok.token_to_id(piece))
            elif marks.hidden(piece):
                with _rust_errors("the tokenizer cannot encode the text"):
                    ids += self._as_text.encode(marks.show(piece), add_special_tokens=False).ids
            elif piece:
                ids += self.encode_nogil(piece, add_special_tokens=False)
        return ids

    @cached_property
    def _special_strings(self) -> list[str]:
        """The special tokens' text, longest first (the one a match prefers)."""
        return sorted((t.content for t in self._tok.get_added_tokens_decoder().values()
                       if t.special and t.content), key=len, reverse=True)

    @cached_property
    def _as_text(self):
        """A copy of the tokenizer that reads special tokens' text as ordinary text."""
        from tokenizers import Tokenizer as HFTokenizer

        copy = HFTokenizer.from_str(self._tok.to_str())
        copy.encode_special_tokens = True
        return copy

    def encode_prompt(self, prompt: str, chat: bool, system: str | None = None) -> list[int]:
        return encode_prompt(self, prompt, chat, system)


@cache
def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


class _Marks:
    """Special tokens' text in message content swapped for marks (private-use characters and a
    random key, so no content can hold a mark) before rendering, and swapped back after."""

    def __init__(self, specials: list[str]):
        import re
        import secrets

        self.specials, key = specials, secrets.token_hex(8)
        self._open, self._close = f"\ue000{key}:", "\ue001"
        self.structural = re.compile("(" + "|".join(map(re.escape, specials)) + ")")
        self._shown = re.compile(re.escape(self._open) + r"(\d+)" + re.escape(self._close))

    def hide(self, content: str) -> str:
        return self.structural.sub(lambda m: f"{self._open}{self.specials.index(m[0])}"
                                   f"{self._close}", content)

    def hidden(self, text: str) -> bool:
        return self._open in text

    def show(self, text: str) -> str:
        return self._shown.sub(lambda m: self.specials[int(m[1])], text)


def _read_config(path: Path) -> dict:
    from kolibri_cli.engine.loader import read_json_object

    return read_json_object(path) if path.is_file() else {}


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
