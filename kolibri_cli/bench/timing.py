"""Kernel measurements as pure functions: read bandwidth and prefill time.

No CLI or rendering here (the `kolibri bench` command wires these in). Timings are medians of
repeats. Non-goals: end-to-end tok/s of the generators, statistics beyond the median, c(n)
(costs/timing.py times it).
"""

import time

import numpy as np
from numba import njit, prange

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))


@njit(parallel=True, fastmath=True, cache=True)
def _parallel_sum(a):
    """a [n] float32 -> sum; vectorized and split across threads, so it runs at read bandwidth"""
    s = np.float32(0.0)
    for i in prange(a.shape[0]):
        s += a[i]
    return s


def measure_read_bandwidth(nbytes: int = 512 << 20, repeats: int = 7) -> float:
    """Bytes/s of a parallel read of a float32 array much larger than the caches (median)."""
    a = np.ones(nbytes // 4, np.float32)
    _parallel_sum(a)  # compile (or load from cache) and fault the pages in
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _parallel_sum(a)
        times.append(time.perf_counter() - t0)
    return a.nbytes / float(np.median(times))


def prefill_time(model, n_tokens: int, repeats: int = 3) -> float:
    """Median seconds of the prefill of an n_tokens prompt into an empty cache (as generation
    runs it: in chunks, the head on the last row only)."""
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, n_tokens)
    cache = model.new_cache(n_tokens)
    times = []
    for _ in range(repeats):
        cache.length = 0
        t0 = time.perf_counter()
        model.prefill(ids, 0, cache)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
