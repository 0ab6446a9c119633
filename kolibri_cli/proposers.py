"""Draft proposers for speculative decoding: given the context, guess the next few tokens.

Scope: model-free proposers behind one tiny interface (`Proposer`); today the n-gram
(prompt-lookup) proposer with vLLM's semantics, plus parsing/validation of its settings.
Non-goals: verification, acceptance, the KV cache (the speculative generator owns those).
"""

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
from numba import njit

from kolibri_cli.errors import KolibriError

DEFAULT_K = 5
DEFAULT_WINDOW = (1, 4)


@runtime_checkable
class Proposer(Protocol):
    """Anything that drafts tokens from the context alone."""

    name: str

    def propose(self, context, max_tokens: int) -> list[int]:
        """Draft at most `max_tokens` tokens to follow `context` (prompt + generated ids)."""
        ...

    def describe(self) -> str:
        """One line for reports: the proposer and its settings."""
        ...


@njit(cache=True)
def _continuation_start(tokens, min_n, max_n):  # tokens: int64[T] -> int
    """Index right after the LEFTMOST earlier occurrence of the longest matching suffix, or -1.

    One KMP pass over the reversed context (vLLM's ngram_proposer): the pattern is the reversed
    suffix (at most max_n long), the text is the reversed context from index 1 on, so a match
    never includes the final position (no self-match). Ties on length keep the LAST match in
    reversed order, i.e. the leftmost occurrence in the original order.
    """
    total = tokens.shape[0]
    if total < min_n + 1:
        return -1
    rev = tokens[::-1]
    lps = np.zeros(max_n, dtype=np.int64)  # prefix function of the pattern
    longest = 0
    position = 0
    matched = 0
    i = 1
    while i < total:
        if rev[matched] == rev[i]:
            matched += 1
            if matched >= longest:
                longest = matched
                position = i
            if i < max_n:
                lps[i] = matched
            if matched == max_n:
                matched = lps[max_n - 1]
            i += 1
        elif matched != 0:
            matched = lps[matched - 1]
        else:
            i += 1
    if longest < min_n:
        return -1
    return total - 1 - position + longest


@dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup: find the longest n in [window_min, window_max] whose last-n-token suffix
    occurred earlier in the context, and propose the up-to-k tokens after its leftmost occurrence.
    Linear time per call."""

    k: int  # draft length cap
    window_min: int  # shortest n-gram that may match
    window_max: int  # longest n-gram tried

    name: ClassVar[str] = "ngram"

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)

    def propose(self, context, max_tokens: int) -> list[int]:
        budget = min(self.k, max_tokens)
        if budget <= 0:
            return []
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start = _continuation_start(tokens, self.window_min, self.window_max)
        if start < 0:
            return []
        return tokens[start : start + budget].tolist()

    def describe(self) -> str:
        return f"ngram k={self.k} window={format_window((self.window_min, self.window_max))}"


PROPOSERS = {"ngram": NgramProposer}


def make_proposer(name: str, k: int, window: tuple[int, int]) -> Proposer:
    """The proposer called `name` with draft cap k and n-gram window (min, max)."""
    if name not in PROPOSERS:
        raise KolibriError(f"unknown proposer {name!r}; available: {', '.join(PROPOSERS)}")
    return PROPOSERS[name](k, window[0], window[1])


def validate_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise KolibriError(f"k must be a whole number >= 1 (draft tokens per pass), got {k!r}")
    return k


def validate_window(window_min: int, window_max: int) -> tuple[int, int]:
    if not 1 <= window_min <= window_max:
        raise KolibriError(
            f"window {window_min}-{window_max} is invalid: use MIN-MAX with 1 <= MIN <= MAX"
        )
    return window_min, window_max


def parse_k(text: str | int) -> int:
    """Parse "5" -> 5; anything but a whole number >= 1 is a KolibriError."""
    if isinstance(text, int):
        return validate_k(text)
    try:
        return validate_k(int(str(text).strip()))
    except ValueError:
        raise KolibriError(f"k must be a whole number >= 1, got {text!r}") from None


def parse_window(text: str) -> tuple[int, int]:
    """Parse "1-4" -> (1, 4); "3" -> (3, 3). Invalid forms ("4-1", "0-3", "a-b", "") raise."""
    parts = str(text).strip().split("-")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise KolibriError(
            f"window {text!r} is invalid: use MIN-MAX (e.g. 1-4) or N (e.g. 3), 1 <= MIN <= MAX"
        )
    low, high = int(parts[0]), int(parts[-1])
    return validate_window(low, high)


def format_window(window: tuple[int, int]) -> str:
    return f"{window[0]}-{window[1]}"


def parse_k_list(text: str | int | list) -> list[int]:
    """Parse "1,2,3" or [1, 2, 3] or 5 -> a list of valid k, duplicates dropped, order kept."""
    items = text if isinstance(text, list) else str(text).split(",")
    return _unique([parse_k(item) for item in items])


def parse_window_list(text: str | list) -> list[tuple[int, int]]:
    """Parse "1-4,2-4" or ["1-4", "2-4"] -> [(1, 4), (2, 4)], duplicates dropped, order kept."""
    items = text if isinstance(text, list) else str(text).split(",")
    return _unique([parse_window(str(item)) for item in items])


def _unique(items: list) -> list:
    return list(dict.fromkeys(items))
