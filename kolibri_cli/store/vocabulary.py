"""A GGUF's tokenizer from its metadata alone: the key-value section at the head of the file is
read, the tensor infos and tensor data after it never are, and nothing is written to the cache.
A deployment GGUF of 40 GB gives its vocabulary, chat template and special tokens in the time of
reading a few MB.

The GGUF layout (versions 2 and 3): b"GGUF", u32 version, u64 tensor count, u64 key-value count,
then each key-value pair as a string key, a u32 value type and the value (strings are a u64
length and UTF-8 bytes; arrays a u32 item type, a u64 count and the items). Every length is
checked against the file's size before it is read, so a damaged file is one error line.
Non-goals: the tensors (store/gguf.py converts them), GGUF version 1.
"""

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

from kolibri_cli.engine.model import Identity, TokenizerOnly
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.errors import KolibriError
from kolibri_cli.store.gguf_scan import MAX_ARRAY, MAX_VOCABULARY
from kolibri_cli.text import printable

# value type -> (struct format, size); 8 string and 9 array are read on their own
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
MAX_KEYS = 1 << 20  # key-value pairs: real files hold a few dozen
CHUNK = 1 << 22  # bytes read at a time: the section of a 150k-token vocabulary is ~10 MB


@dataclass(frozen=True)
class Field:
    """One key's value, as `gguf.GGUFReader`'s fields give it (`contents()`), and the raw bytes
    of the whole key-value pair (what the tokenizer's digest is taken over)."""

    value: object
    raw: bytes = field(repr=False)

    def contents(self):
        return self.value


@dataclass
class Metadata:
    """The key-value section of a GGUF: `fields` as store/gguf.py's readers take them (they read
    no tensors, so `tensors` is empty)."""

    path: Path
    fields: dict[str, Field]
    tensors: tuple = ()

    def tokenizer_sha256(self) -> str:
        """sha256 over the raw key-value pairs of tokenizer.*, in file order."""
        h = hashlib.sha256()
        for f in self.fields.values():
            h.update(f.raw)  # b"" for keys outside tokenizer.*
        return h.hexdigest()


class _Cursor:
    """Reads forward through the file's head, a chunk at a time; never past what it is asked."""

    def __init__(self, f, size: int, path: Path):
        self.f, self.size, self.path = f, size, path
        self.buf, self.pos, self.base = b"", 0, 0  # buf holds file bytes base..base+len(buf)

    def take(self, n: int) -> bytes:
        start = self.base + self.pos
        if n < 0 or start + n > self.size:
            raise KolibriError(f"{self.path}: truncated GGUF metadata (a value runs past the end "
                               "of the file)")
        while self.pos + n > len(self.buf):
            more = self.f.read(max(CHUNK, n))
            if not more:  # the file shrank while being read
                raise KolibriError(f"{self.path}: truncated GGUF metadata")
            self.buf, self.base, self.pos = self.buf[self.pos:] + more, start, 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, size: int):
        return struct.unpack(fmt, self.take(size))[0]

    @property
    def offset(self) -> int:
        return self.base + self.pos


def read_metadata(path: Path) -> Metadata:
    """The key-value section of the GGUF at `path`; its tensors are not read."""
    path = Path(path)
    if not path.is_file():
        raise KolibriError(f"{path}: no such file" if not path.exists()
                           else f"{path}: not a regular file, expected a GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != b"GGUF":
            raise KolibriError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
        f.seek(0)
        cur = _Cursor(f, path.stat().st_size, path)
        cur.take(4)
        version = cur.unpack("<I", 4)
        if version not in (2, 3):
            raise KolibriError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        cur.take(8)  # the tensor count: their infos follow the key-value pairs, unread
        n_kv = cur.unpack("<Q", 8)
        if n_kv > MAX_KEYS:
            raise KolibriError(f"{path}: not a readable GGUF file ({n_kv} metadata keys)")
        fields = {}
        for _ in range(n_kv):
            start, key = cur.offset, _string(cur)
            value = _value(cur, cur.unpack("<I", 4), key)
            digested = key.startswith("tokenizer.")
            fields[key] = Field(value, _span(f, start, cur.offset) if digested else b"")
    return Metadata(path, fields)


def _span(f, start: int, stop: int) -> bytes:
    """The file's bytes start..stop (re-read: the cursor keeps only its current chunk)."""
    here = f.tell()
    f.seek(start)
    raw = f.read(stop - start)
    f.seek(here)
    return raw


def _string(cur: _Cursor) -> str:
    raw = cur.take(cur.unpack("<Q", 8))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise KolibriError(f"{cur.path}: GGUF metadata holds text that is not UTF-8 "
                           f"({printable(raw[:40].decode('utf-8', 'replace'))})") from None


def _value(cur: _Cursor, kind: int, key: str):
    if kind == _STRING:
        return _string(cur)
    if kind == _ARRAY:
        item, count = cur.unpack("<I", 4), cur.unpack("<Q", 8)
        limit = MAX_VOCABULARY if key == "tokenizer.ggml.tokens" else MAX_ARRAY
        if count > limit:
            raise KolibriError(f"{cur.path}: not a GGUF kolibri can read: {key} claims "
                               f"{count:,} entries (at most {limit:,})")
        if item == _STRING:
            return [_string(cur) for _ in range(count)]
        if item not in _SCALARS:
            raise KolibriError(f"{cur.path}: GGUF metadata has an array of type {item}")
        fmt, size = _SCALARS[item]
        return list(struct.unpack(f"<{count}{fmt[1]}", cur.take(count * size)))
    if kind not in _SCALARS:
        raise KolibriError(f"{cur.path}: GGUF metadata has a value of unknown type {kind}")
    return cur.unpack(*_SCALARS[kind])


def gguf_tokenizer(path: Path) -> TokenizerOnly:
    """The tokenizer-only model of a GGUF: its vocabulary, merges, special tokens and chat
    template (a gpt2-style byte-level BPE, as store/gguf.py builds it for an import); the context
    and eos id from its metadata; identified by its tokenizer metadata's digest."""
    from kolibri_cli.store.gguf import build_tokenizer, tokenizer_config

    meta = read_metadata(path)
    try:
        tokenizer = Tokenizer.of(build_tokenizer(meta), tokenizer_config(meta))
        eos = _optional(meta, "tokenizer.ggml.eos_token_id")
        arch = _optional(meta, "general.architecture")
        context = _optional(meta, f"{arch}.context_length") if isinstance(arch, str) else None
    except KolibriError as e:
        raise KolibriError(f"{path}: {e}") from None
    return TokenizerOnly(
        name=Path(path).name.removesuffix(".gguf"), tokenizer=tokenizer, path=Path(path),
        vocab_size=tokenizer.vocab_size, context=context if _count(context) else None,
        eos_ids=() if eos is None else (eos,),
        identity=Identity(tokenizer_sha256=meta.tokenizer_sha256()))


def _optional(meta: Metadata, key: str):
    f = meta.fields.get(key)
    return None if f is None else f.value


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
