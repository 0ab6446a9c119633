"""llama.cpp's `ngram-cache`: n-gram -> counts of the next token, from three caches — the
context (tokens seen by the server slot), a dynamic one and a static one (files) — drafting one
token at a time.

A port of common/ngram-cache.cpp (`common_ngram_cache_update`, `common_ngram_cache_draft`, both
`try_draft`, `common_ngram_cache_load`/`_save`) and of `common_speculative_impl_ngram_cache` in
common/speculative.cpp: n-grams of 1..4 tokens; a context cache that lives as long as the server
and only learns the tokens at positions it has not seen yet (`cache_size`), so a shorter later
request teaches it nothing until it outgrows the longest history seen (upstream behaviour); up to
8 tokens a draft. Ties between equally frequent tokens go to the one iterated first by libstdc++'s
unordered_map (`std_order.StdCounts`). File format (llama.cpp's, little-endian): per n-gram, 4
int32 tokens (-1 padded), int32 count of entries, then (int32 token, int32 count) pairs.
"""

import mmap
import os
import struct
from pathlib import Path

from kolibri_cli.decode.proposers.llamacpp.std_order import StdCounts
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import open_regular

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2  # LLAMA_NGRAM_MIN / _MAX / _STATIC
NULL = -1  # LLAMA_TOKEN_NULL
N_DRAFT = 8  # upstream's fixed draft length
# Below these sample sizes / percentages of the most frequent token (per n-gram size 1..4) a
# cache gives no draft token: lax for the context cache, strict for the dynamic one.
MIN_SAMPLES_LAX, MIN_PERCENT_LAX = (2, 2, 1, 1), (66, 50, 50, 50)
MIN_SAMPLES_STRICT, MIN_PERCENT_STRICT = (4, 3, 2, 2), (75, 66, 66, 66)

MAX_FILE_BYTES = 1 << 30  # a cache file: ~60 M (token, count) pairs, ~10 GB as Python objects
NgramCache = dict[tuple[int, ...], StdCounts]  # 4-token n-gram (NULL padded) -> next-token counts


def ngram_key(tokens) -> tuple[int, ...]:
    return tuple(tokens) + (NULL,) * (NGRAM_MAX - len(tokens))


def update(cache: NgramCache, tokens: list[int], ngram_min: int = NGRAM_MIN,
           ngram_max: int = NGRAM_MAX) -> None:
    """`common_ngram_cache_update` with nnew = all: count every (n-gram, next token) of `tokens`,
    n-gram size by size."""
    for size in range(ngram_min, ngram_max + 1):
        for i in range(size, len(tokens)):
            key = ngram_key(tokens[i - size:i])
            part = cache.get(key)
            if part is None:
                part = cache[key] = StdCounts()
            part.add(tokens[i])


def draft(inp: list[int], n_draft: int, context: NgramCache, dynamic: NgramCache,
          static: NgramCache) -> list[int]:
    """`common_ngram_cache_draft`: up to n_draft tokens after `inp`, one at a time — the context
    cache (lax thresholds), else the dynamic one (strict), else the static one alone; each
    primary choice weighted by the static counts after the last 2 tokens."""
    if len(inp) < NGRAM_STATIC:
        return []
    seq, drafted = list(inp), []
    while len(drafted) < n_draft:
        static_part = static.get(ngram_key(seq[-NGRAM_STATIC:]))
        ngrams = [ngram_key(seq[-size:]) for size in range(NGRAM_MIN, NGRAM_MAX + 1)]
        token = _try_primary(context, ngrams, static_part, MIN_SAMPLES_LAX, MIN_PERCENT_LAX)
        if token == NULL:
            token = _try_primary(dynamic, ngrams, static_part, MIN_SAMPLES_STRICT,
                                 MIN_PERCENT_STRICT)
        if token == NULL:
            token = _try_static(static_part)
        if token == NULL:
            break
        seq.append(token)
        drafted.append(token)
    return drafted


def _try_primary(cache: NgramCache, ngrams, static_part, min_samples, min_percent) -> int:
    """The longest n-gram whose most frequent next token (by count x static weight) passes the
    thresholds for its size."""
    for i in range(len(ngrams) - 1, -1, -1):
        part = cache.get(ngrams[i])
        if part is None:
            continue
        best, best_count, best_static, total = NULL, 0, 0, 0
        for token, count in part.items():
            weight = 100 * static_part.counts[token] if static_part is not None and \
                token in static_part.counts else 1
            if count * weight > best_count * best_static:
                best, best_count, best_static = token, count, weight
            total += count
        if total < min_samples[i] or 100 * best_count < min_percent[i] * total:
            continue
        return best
    return NULL


def _try_static(part) -> int:
    """The static cache alone: its most frequent token after the last 2, with lax thresholds."""
    if part is None:
        return NULL
    best, best_count, total = NULL, 0, 0
    for token, count in part.items():
        if count > best_count:
            best, best_count = token, count
        total += count
    i = NGRAM_STATIC - 1
    if total < MIN_SAMPLES_LAX[i] or 100 * best_count < MIN_PERCENT_LAX[i] * total:
        return NULL
    return best


def load(path: str | Path) -> NgramCache:
    """`common_ngram_cache_load`: a cache file written by llama.cpp (llama-lookup-create,
    llama-lookup-merge) or `to_bytes`; the first entry of a repeated n-gram wins, as upstream.
    A regular file of at most MAX_FILE_BYTES, read memory-mapped (a sparse 3 GB file costs no
    memory: its first entry is refused)."""
    with open_regular(path, "n-gram cache", MAX_FILE_BYTES) as f:
        if os.fstat(f.fileno()).st_size == 0:
            return {}
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cache: NgramCache = {}
            pos = 0
            while pos < len(data):
                pos, key, part = _read_entry(data, pos, path)
                cache.setdefault(key, part)
            return cache


def _read_entry(data: bytes, pos: int, path) -> tuple[int, tuple[int, ...], StdCounts]:
    try:
        *key, entries = struct.unpack_from("<5i", data, pos)
        if entries <= 0 or pos + 20 + 8 * entries > len(data):
            raise ValueError
        pairs = struct.unpack_from(f"<{2 * entries}i", data, pos + 20)
    except (struct.error, ValueError):
        raise KolibriError(f"{path}: not a llama.cpp n-gram cache (bad entry at byte {pos})") \
            from None
    part = StdCounts()
    for token, count in zip(pairs[::2], pairs[1::2], strict=True):
        if count <= 0:
            raise KolibriError(f"{path}: not a llama.cpp n-gram cache (count {count} at byte "
                               f"{pos})")
        if token not in part.counts:  # emplace: a repeated token keeps its first count
            part.add(token, count)
    return pos + 20 + 8 * entries, tuple(key), part


def to_bytes(cache: NgramCache) -> bytes:
    """`common_ngram_cache_save`'s format (entries in insertion order)."""
    chunks = []
    for key, part in cache.items():
        pairs = [x for token_count in part.items() for x in token_count]
        chunks.append(struct.pack(f"<5i{len(pairs)}i", *key, len(part), *pairs))
    return b"".join(chunks)


class CacheSlot:
    """`common_speculative_impl_ngram_cache` for one server slot: the three caches and how much
    of the history the context cache has seen."""

    def __init__(self, n_draft: int = N_DRAFT, static: NgramCache | None = None,
                 dynamic: NgramCache | None = None):
        self.n_draft = n_draft
        self.context: NgramCache = {}
        self.dynamic = dynamic if dynamic is not None else {}
        self.static = static if static is not None else {}
        self.cache_size = 0  # history positions the context cache has seen

    def draft(self, history: list[int], sampled: int) -> list[int]:
        """`draft_one`: history = the tokens before the sampled one."""
        if self.cache_size < len(history) + 1:
            update(self.context, history[self.cache_size:] + [sampled])
            self.cache_size = len(history) + 1
        return draft(history + [sampled], self.n_draft, self.context, self.dynamic, self.static)
