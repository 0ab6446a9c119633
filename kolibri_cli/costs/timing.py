"""Timing c(n) on this host's kernel: n-token forwards after a filled cache, interleaved in one
run so machine noise hits every n alike, each round's c(n) kept (its forwards timed moments
apart); and `time_here`, which times the c(n) a run needs and keeps them in the bench store.

No CLI or rendering here (`kolibri bench` and `probe --costs measure` wire these in).
Non-goals: a server's c(n) (bench/engine_costs.py), statistics beyond the median.
"""

import time

import numpy as np

from kolibri_cli.costs.pricing import Pricing


def _filled_cache(model, context_len: int, n_tokens: int, seed: int = 0):
    """A cache holding context_len random positions, with room for n_tokens more."""
    cache = model.new_cache(context_len + n_tokens)
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, context_len + n_tokens)
    if context_len:
        model.prefill(ids[:context_len], 0, cache)
    return cache, ids[context_len:]


def _time_once(model, cache, ids, context_len: int) -> float:
    cache.length = context_len  # roll back: every repeat runs at the same context length
    t0 = time.perf_counter()
    model.forward(ids, context_len, cache)
    return time.perf_counter() - t0


def forward_times(model, max_n: int, context_len: int = 100, repeats: int = 7,
                  ticks=None, sizes: list[int] | None = None) -> dict[int, float]:
    """Median seconds of an n-token forward for n = 1..max_n (or each n of `sizes`, which holds
    1), measured interleaved in one run; `ticks(done, total)` after each round."""
    times = forward_rounds(model, max_n, context_len, repeats, ticks, sizes)
    return {n: float(np.median(t)) for n, t in times.items()}


def forward_rounds(model, max_n: int, context_len: int = 100, repeats: int = 7,
                   ticks=None, sizes: list[int] | None = None) -> dict[int, list[float]]:
    """forward_times' timings, every round's: {n: [seconds of round 1, 2, ...]}."""
    sizes = sorted(set(sizes)) if sizes else list(range(1, max_n + 1))
    cache, ids = _filled_cache(model, context_len, sizes[-1])
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for n in times:  # warm-up
        _time_once(model, cache, ids[:n], context_len)
    for r in range(repeats):
        for n in times:
            times[n].append(_time_once(model, cache, ids[:n], context_len))
        if ticks is not None:
            ticks(r + 1, repeats)
    return times


def curve_sizes(small: int, most: int) -> list[int]:
    """The row counts a c(T) curve up to `most` tokens is timed at: every n up to `small`, then
    a grid growing by half octaves (8, 12, 16, 24, 32, ...), and `most` itself; linear
    interpolation (costs.model.cost_model) fills the rest."""
    sizes, n = list(range(1, min(small, most) + 1)), 8
    while n < most:
        sizes += [n, n * 3 // 2]
        n *= 2
    return sorted({s for s in sizes if s <= most} | {most})


def verify_costs(model, max_n: int, context_len: int = 100, repeats: int = 7) -> dict[int, float]:
    """c(n) = time(n-token forward) / time(1-token forward) for n = 1..max_n, from one run."""
    return costs(forward_times(model, max_n, context_len, repeats))


def costs(times: dict[int, float]) -> dict[int, float]:
    """{n: seconds} -> {n: seconds / seconds of n=1}"""
    return {n: t / times[1] for n, t in times.items()}


def round_costs(times: dict[int, list[float]]) -> list[dict[int, float]]:
    """{n: [seconds per round]} -> each round's c(n) (its n-token forward over its 1-token one,
    timed moments apart: the machine's drift cancels)."""
    return [costs({n: t[r] for n, t in times.items()}) for r in range(len(times[1]))]


def median_times(times: dict[int, list[float]]) -> dict[int, float]:
    return {n: float(np.median(t)) for n, t in times.items()}


def time_here(model, top: int, most: int, repeats: int, ticks=None) -> Pricing:
    """c(1..top) timed now on `model` with this host's kernel — and on a grid up to `most`
    tokens (a curve for --concurrency) — after BENCH_CONTEXT cached tokens, `repeats` rounds,
    kept in the bench store as `kolibri bench` keeps its own, its rounds with it; priced with
    the median of this kernel's stored rounds (source "run")."""
    from kolibri_cli.costs import store as benchcosts
    from kolibri_cli.costs.model import BENCH_CONTEXT
    from kolibri_cli.engine.jit import get_threads

    rounds = forward_rounds(model.transformer, top, BENCH_CONTEXT, repeats, ticks,
                            curve_sizes(top, most))
    timed = costs(median_times(rounds))
    entry = benchcosts.save(benchcosts.entry_for(model, get_threads(), timed,
                                                 round_costs(rounds)))
    return Pricing("run", entry.costs, bench=entry, rounds=entry.rounds)
