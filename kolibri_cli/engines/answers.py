"""A server's JSON answer read into typed values, every field checked where it is read.

A server is outside input: an answer of the wrong shape is one KolibriError naming the server,
the endpoint and the field (`timings.prompt_ms is nan; expected ...`), never a TypeError,
ZeroDivisionError or a garbage golden later. Token ids are integers (not booleans) in the model's
vocabulary, counts are integers >= 0, times are finite milliseconds, texts are strings of valid
Unicode. Non-goals: what the fields mean (api.py).
"""


from kolibri_cli.engines.transport import BODY_BYTES
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import finite, shown

MAX_TOKEN_ID = 2**31 - 1  # when the vocabulary is not known: ids are int32 everywhere
MAX_TEXT = 4096  # characters of a descriptive string (a model name or path, a version)
MAX_COUNT = 2**63 - 1  # a counter past int64 is no server's
BYTES_PER_TOKEN = 2048  # of a completion: llama.cpp's top-2 logprobs per token are ~400 bytes
BYTES_PER_PROMPT_ID = 16  # vLLM echoes the prompt's ids


def completion_bytes(prompt_tokens: int, max_tokens: int) -> int:
    """The byte cap of a completion's answer: generous for what was asked, not unbounded."""
    return BODY_BYTES + BYTES_PER_PROMPT_ID * prompt_tokens + BYTES_PER_TOKEN * max_tokens


class Answer:
    """One JSON object of an answer, `where` it came from (server URL and endpoint) and its
    `path` inside the answer ("" for the top level)."""

    def __init__(self, value, where: str, path: str = ""):
        self.where, self.path = where, path
        if not isinstance(value, dict):
            raise self._error(None, value, "a JSON object")
        self.value = value

    def has(self, name: str) -> bool:
        return self.value.get(name) is not None

    def get(self, name: str):
        return self.value.get(name)

    def object(self, name: str) -> "Answer | None":
        """The field as an Answer; None when absent or null."""
        if not self.has(name):
            return None
        return Answer(self.value[name], self.where, self._name(name))

    def objects(self, name: str) -> list["Answer"]:
        """A list of objects ([] when absent or null)."""
        value = self.value.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._error(name, value, "a list of JSON objects")
        return [Answer(v, self.where, f"{self._name(name)}[{i}]") for i, v in enumerate(value)]

    def ids(self, name: str, vocab: int | None, most: int | None = None) -> list[int]:
        """A non-empty list of token ids in 0..vocab-1, at most `most` of them."""
        value = self.value.get(name)
        if not isinstance(value, list) or not value:
            keys = ", ".join(sorted(map(str, self.value)))[:200]
            raise KolibriError(f"{self.where}: the answer has no list of token ids "
                               f"{self._name(name)!r} (it has: {keys})")
        if most is not None and len(value) > most:
            raise KolibriError(f"{self.where}: {self._name(name)} holds {len(value)} token ids, "
                               f"more than the {most} asked for")
        top = (vocab or MAX_TOKEN_ID + 1) - 1
        if set(map(type, value)) != {int} or min(value) < 0 or max(value) > top:
            i = next(i for i, t in enumerate(value)
                     if type(t) is not int or not 0 <= t <= top)
            raise self._error(f"{name}[{i}]", value[i], f"a token id in 0..{top}")
        return value

    def count(self, name: str) -> int | None:
        """An integer >= 0, or None when absent."""
        value = self.value.get(name)
        if value is None:
            return None
        if type(value) is not int or not 0 <= value <= MAX_COUNT:
            raise self._error(name, value, f"an integer in 0..{MAX_COUNT}")
        return value

    def ms(self, name: str, positive: bool = True) -> float | None:
        """A finite number of milliseconds, > 0 (or >= 0 unless `positive`); None when absent."""
        value = self.value.get(name)
        if value is None:
            return None
        low = "> 0" if positive else ">= 0"
        number = finite(value)
        if number is None or number < 0 or (positive and number == 0):
            raise self._error(name, value, f"a finite number of milliseconds {low}")
        return number

    def number(self, name: str) -> float | None:
        """A finite number, or None when absent."""
        value = self.value.get(name)
        if value is None:
            return None
        number = finite(value)
        if number is None:
            raise self._error(name, value, "a finite number")
        return number

    def text(self, name: str, limit: int | None = MAX_TEXT) -> str | None:
        """A string of valid Unicode (at most `limit` characters), or None when absent."""
        value = self.value.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or (limit is not None and len(value) > limit):
            what = "a string" + (f" of at most {limit} characters" if limit else "")
            raise self._error(name, value, what)
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            raise self._error(name, value, "valid Unicode (it holds a lone surrogate)")
        return value

    def _name(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _error(self, name: str | None, value, expected: str) -> KolibriError:
        field = self._name(name) if name is not None else (self.path or "the answer")
        return KolibriError(f"{self.where}: {field} is {_described(value)}; expected {expected}")


def answer(value, where: str) -> Answer:
    """The top level of an answer, which must be a JSON object."""
    return Answer(value, where)


def _described(value) -> str:
    """A short, safe description of an unexpected value (no deep repr of a hostile structure)."""
    if isinstance(value, bool) or value is None:
        return "true" if value is True else "false" if value is False else "null"
    if isinstance(value, int | float):
        return shown(value, 40)
    if isinstance(value, str):
        return f"the string {shown(value, 40)}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a JSON object"
    return type(value).__name__
