"""A GGUF's header walked before the gguf library reads it: every count checked against the bytes
the file holds and against limits no real model reaches.

The gguf library builds a Python object per array element before anything can be checked: a 4 KB
sparse file whose tokenizer array claims 10^8 strings took 6.9 GB and minutes. This walk only
reads the counts and lengths (memory-mapped, nothing kept), in time linear in the header's bytes.
Non-goal: checking the values themselves (gguf.py does, once the library has read them).
"""

import mmap
import struct
from pathlib import Path

from kolibri_cli.errors import KolibriError

MAX_VOCABULARY = 4 * 2**20  # tokens: the largest real vocabularies are ~256k
MAX_ARRAY = 2**24  # elements in any other metadata array (merges are ~ the vocabulary)
MAX_TENSORS = 2**16
MAX_KEYS = 2**16
MAX_DIMS = 8
MAX_NESTING = 4  # arrays of arrays: real models nest none (a deep file overflowed the stack)

# GGUF value types: fixed sizes in bytes; 8 = string, 9 = array
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


class _Bad(Exception):
    pass


class _Walk:
    def __init__(self, view):
        self.view, self.pos = view, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.view):
            raise _Bad(f"cut short at byte {self.pos}")
        value = struct.unpack_from(fmt, self.view, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def skip(self, n: int) -> None:
        if n > len(self.view) - self.pos:
            raise _Bad(f"claims {n} bytes at byte {self.pos}, past the end of the file")
        self.pos += n

    def count(self, n: int, least_bytes: int, limit: int, what: str) -> int:
        """`n` elements of at least `least_bytes` each: within `limit` and the bytes left."""
        if n > limit:
            raise _Bad(f"{what} claims {n:,} entries (at most {limit:,})")
        if n * least_bytes > len(self.view) - self.pos:
            raise _Bad(f"{what} claims {n:,} entries, more than the file's "
                       f"{len(self.view) - self.pos:,} remaining bytes can hold")
        return n

    def string(self) -> bytes:
        n = self.take("<Q")
        self.skip(n)
        return bytes(self.view[self.pos - n:self.pos]) if n <= 256 else b""

    def value(self, kind: int, key: str, depth: int = 0) -> None:
        if kind in SIZES:
            self.skip(SIZES[kind])
        elif kind == STRING:
            self.string()
        elif kind == ARRAY:
            self.array(key, depth + 1)
        else:
            raise _Bad(f"{key} has unknown value type {kind}")

    def array(self, key: str, depth: int = 1) -> None:
        if depth > MAX_NESTING:
            raise _Bad(f"{key} nests arrays more than {MAX_NESTING} deep")
        kind, n = self.take("<IQ")
        limit = MAX_VOCABULARY if key == "tokenizer.ggml.tokens" else MAX_ARRAY
        least = SIZES.get(kind, 8 if kind == STRING else 12)
        self.count(n, least, limit, key)
        if kind in SIZES:
            self.skip(n * SIZES[kind])
            return
        for _ in range(n):
            self.value(kind, key, depth)


def check(path: Path) -> None:
    """Raise a KolibriError naming the first count in the GGUF at `path` that its bytes cannot
    hold or that passes a limit (vocabulary > MAX_VOCABULARY tokens, ...)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        try:
            _walk(_Walk(view))
        except _Bad as e:
            raise KolibriError(f"{path}: not a readable GGUF file: truncated or damaged ({e})"
                               ) from None


def _walk(w: _Walk) -> None:
    _magic, _version, n_tensors, n_keys = w.take("<4sIQQ")
    w.count(n_keys, 13, MAX_KEYS, "the header's key count")
    w.count(n_tensors, 24, MAX_TENSORS, "the header's tensor count")
    for _ in range(n_keys):
        key = w.string().decode("utf-8", "replace")
        w.value(w.take("<I"), key)
    for _ in range(n_tensors):
        w.string()
        dims = w.take("<I")
        if dims > MAX_DIMS:
            raise _Bad(f"a tensor claims {dims} dimensions")
        w.skip(8 * dims + 12)
