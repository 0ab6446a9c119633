"""Proposer settings: the defaults, and parsing/validation of k, the n-gram window and
llama.cpp's per-type options."""

from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.text import shown

DEFAULT_PROPOSER = "vllm"  # the probe's and bench's default: a fixed rule, as engines run it
DEFAULT_SPEC_PROPOSER = "guard"  # what `kolibri generate --spec` and chat draft with
DEFAULT_K = 5  # draft tokens per verify pass
GUARD_K = 16  # the guard's cap: it drafts less wherever longer drafts would not pay
DEFAULT_WINDOW = (1, 4)  # n-gram lengths tried, (min, max)
# Sane maxima, far above any useful setting (upstream defaults: k 5-48, n 2-12): proposers
# allocate per n and per draft position, so an unbounded value is a hang or a MemoryError.
# The model's context bounds both again once a model is loaded.
MAX_K = 1024
MAX_WINDOW = 1024


def validate_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise KolibriError(f"k must be a whole number in 1..{MAX_K} (draft tokens per pass), "
                           f"got {shown(k)}")
    return k


def validate_window(window_min: int, window_max: int) -> tuple[int, int]:
    if not 1 <= window_min <= window_max <= MAX_WINDOW:
        raise KolibriError(f"window {window_min}-{window_max} is invalid: use MIN-MAX with "
                           f"1 <= MIN <= MAX <= {MAX_WINDOW}")
    return window_min, window_max


def parse_k(text: str | int) -> int:
    """Parse "5" -> 5; anything but a whole number in 1..MAX_K is a KolibriError."""
    if isinstance(text, int):
        return validate_k(text)
    try:
        return validate_k(int(str(text).strip()))
    except ValueError:  # not a number, or 4300+ digits
        raise KolibriError(f"k must be a whole number in 1..{MAX_K}, got {shown(text)}") from None


def parse_window(text: str) -> tuple[int, int]:
    """Parse "1-4" -> (1, 4); "3" -> (3, 3). Invalid forms ("4-1", "0-3", "a-b", "") raise."""
    parts = [p.strip() for p in str(text).strip().split("-")]
    if len(parts) > 2 or not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in parts):
        raise KolibriError(f"window {shown(text)} is invalid: use MIN-MAX (e.g. 1-4) or N "
                           f"(e.g. 3), 1 <= MIN <= MAX <= {MAX_WINDOW}")
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


@dataclass(frozen=True)
class LlamaCppOptions:
    """llama.cpp's per-type options besides n (the window) and m (k); None = upstream's default.
    Proposers of other families ignore them."""

    min_hits: int | None = None  # ngram-map-k4v: key hits before a value drafts (upstream 1)
    n_min: int | None = None  # ngram-mod: fewest chained hits that make a draft (upstream 48)
    lookup_cache_static: Path | None = None  # ngram-cache: a llama.cpp static cache file
    lookup_cache_dynamic: Path | None = None  # ngram-cache: a llama.cpp dynamic cache file

    def __post_init__(self):
        for name in ("min_hits", "n_min"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < (1 if name == "min_hits" else 0)):
                low = 1 if name == "min_hits" else 0
                raise KolibriError(f"{name.replace('_', '-')} must be a whole number >= {low}, "
                                   f"got {value!r}")

    def label(self) -> str:
        """" min-hits=2 n-min=8 static=file.bin" (only what was set), for run names."""
        parts = [f"min-hits={self.min_hits}" if self.min_hits is not None else "",
                 f"n-min={self.n_min}" if self.n_min is not None else "",
                 f"static={Path(self.lookup_cache_static).name}"
                 if self.lookup_cache_static else "",
                 f"dynamic={Path(self.lookup_cache_dynamic).name}"
                 if self.lookup_cache_dynamic else ""]
        return "".join(" " + p for p in parts if p)
