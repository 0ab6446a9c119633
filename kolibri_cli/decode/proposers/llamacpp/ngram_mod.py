"""llama.cpp's `ngram-mod`: one hash pool of n-gram -> next token shared by every request a
server serves, and a draft made by chaining lookups.

A port of common/ngram-mod.cpp (`common_ngram_mod`: `idx`, `add`, `get`, `reset`) and of
`common_speculative_impl_ngram_mod` in common/speculative.cpp (`begin`, `draft_one`, `accept`):
the pool has 4M entries (the last writer wins, collisions included); a request's prompt n-grams
are added at its start, generated ones in chunks of more than 32 tokens; a draft needs at least
n_min chained hits and stops at n_max; five drafts in a row with under a quarter accepted reset
the pool (that streak survives across requests, as upstream).
"""

import numpy as np
from numba import njit

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

POOL_SIZE = 4 * 1024 * 1024  # entries of the shared pool
EMPTY = -1
LCG = np.uint64(6364136223846793005)
RESET_OCCUPANCY = 0.25  # begin() resets a pool fuller than this
LOW_ACCEPTANCE = 0.25  # an accepted fraction below this counts towards the reset streak
LOW_STREAK = 5  # consecutive low-acceptance drafts that reset the pool
ADD_CHUNK = 32  # generated n-grams are added once more than this many tokens are new


@njit(cache=True)
def _idx(tokens, start, n):  # tokens: int64[T] -> int
    """`common_ngram_mod::idx`: a 64-bit LCG over n tokens, modulo the pool size."""
    h = np.uint64(0)
    for i in range(n):
        h = h * LCG + np.uint64(tokens[start + i])
    return h % np.uint64(POOL_SIZE)


@njit(cache=True)
def _add(pool, tokens, lo, hi, n):  # pool: int32[POOL_SIZE], tokens: int64[T] -> added
    """`add` the n-grams starting at lo..hi-1: pool[idx(ngram)] = the token after it; returns how
    many entries were empty before."""
    added = 0
    for i in range(lo, hi):
        j = _idx(tokens, i, n)
        added += pool[j] == EMPTY
        pool[j] = tokens[i + n]
    return added


@njit(cache=True)
def _chain(pool, seed, n, n_min, n_max):  # seed: int64[n] -> int64[<= n_max]
    """Follow the pool from the last n tokens: up to n_max tokens, nothing if fewer than n_min."""
    out = np.empty(n + n_max, np.int64)
    out[:n] = seed
    for i in range(n_max):
        token = pool[_idx(out, i, n)]
        if token == EMPTY:
            if i < n_min:
                return out[:0]
            return out[n:n + i].copy()
        out[n + i] = token
    return out[n:].copy()


class NgramModPool:
    """The shared pool (`common_ngram_mod`) and one server slot's bookkeeping (`seq_info`)."""

    def __init__(self, n_match: int, n_min: int, n_max: int):
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.pool = np.full(POOL_SIZE, EMPTY, np.int32)
        self.used = 0  # occupied entries
        self.i_last = 0  # n-grams starting before this are in the pool
        self.n_draft_last = 0  # length of the last draft (before any budget cut)
        self.n_low = 0  # consecutive drafts with a low accepted fraction

    def reset(self) -> None:
        self.pool.fill(EMPTY)
        self.used = 0

    def begin(self, prompt: np.ndarray) -> None:
        """A new request: add every n-gram of the prompt; reset a pool that got too full."""
        self.i_last, self.n_draft_last = 0, 0
        if len(prompt) < self.n:
            return
        self.used += _add(self.pool, prompt, 0, len(prompt) - self.n, self.n)
        self.i_last = len(prompt) - self.n
        if self.used / POOL_SIZE > RESET_OCCUPANCY:
            self.reset()

    def draft(self, history: np.ndarray, sampled: int) -> list[int]:
        """`draft_one`: history = the tokens before the sampled one."""
        n, cur_len = self.n, len(history)
        self.n_draft_last = 0
        if cur_len < n:
            return []
        if self.i_last + ADD_CHUNK < cur_len:
            self.used += _add(self.pool, history, self.i_last, cur_len - n, n)
            self.i_last = cur_len - n
        seed = np.append(history[cur_len - n + 1:], sampled)  # [n]
        drafted = _chain(self.pool, seed, n, self.n_min, self.n_max)
        self.n_draft_last = len(drafted)
        return drafted.tolist()

    def accept(self, n_accepted: int) -> None:
        """Count a low-acceptance streak; five in a row reset the pool."""
        if self.n_draft_last == 0:
            return
        if n_accepted / self.n_draft_last >= LOW_ACCEPTANCE:
            self.n_low = 0
            return
        self.n_low += 1
        if self.n_low >= LOW_STREAK:
            self.reset()
            self.n_low, self.i_last = 0, 0


def warm_up() -> None:
    """Compile (a machine's first run) or load from numba's cache this module's kernels."""
    pool = NgramModPool(2, 1, 2)
    pool.begin(np.zeros(4, np.int64))
    pool.draft(np.zeros(4 + ADD_CHUNK, np.int64), 0)
