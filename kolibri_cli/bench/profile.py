"""`kolibri bench --profile`: where one forward's time goes, piece by piece, against the two
physical limits — the memory-bandwidth bound of the bytes the piece reads and this host's vector
peak for the multiply-adds it does.

The kernel itself stamps its pieces (engine/clock.py): each matmul kind (q/k/v, o, gate/up,
down, the head), attention, norms, RoPE with the cache writes, the embedding lookup, and for
every parallel region the span from the first thread's start of work to the last one's end. A
piece's time minus the spans of its regions is the cost of starting and joining the threads
("fork/join"). The forwards profiled are the ones decoding runs: 1 token (plain decode) and n
tokens (a verify pass), both at a 100-token context, alternating, medians of repeats.

Non-goals: per-layer figures (every layer has the same shapes), prefill, a per-thread timeline.
"""

import time
from dataclasses import asdict, dataclass

import numpy as np
from numba import njit, prange

from kolibri_cli.engine import clock
from kolibri_cli.engine.simd import vbcast, vfma, vsum, vzero

CONTEXT = 100  # cached positions when the forwards are timed (as c(n) is)
LANES = 16  # float32 lanes of one vfma


@dataclass
class Piece:
    kind: str  # clock.KINDS, or BETWEEN
    ms: float  # median per forward: for a parallel piece, the spans of its regions
    bytes: int  # read from memory per forward (weights; attention: the KV cache)
    macs: int  # multiply-adds per forward


BETWEEN = "between regions"  # starting and joining threads, and a parallel piece's serial setup
REST = "rest"  # outside the kernel's pieces: the Python call, argument checks, allocations


@dataclass
class ForwardProfile:
    tokens: int  # L: tokens in the forward
    ms: float  # median wall time of the whole forward
    regions: int  # parallel regions entered
    pieces: list[Piece]  # KINDS, BETWEEN, REST


@dataclass
class ProfileResult:
    model: str
    numerics: str
    threads: int
    cpu: str
    repeats: int
    bandwidth_gb_s: float  # measured read bandwidth, all threads
    peak_gmacs: float  # float32 multiply-adds per second at the vector peak, all threads (G)
    forwards: list[ForwardProfile]

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- this host's limits


@njit(cache=True)
def _cycles():
    return clock.cycles()


def cycles_per_second(seconds: float = 0.05) -> float:
    """The rate of clock.cycles, against perf_counter"""
    _cycles()
    t0, c0 = time.perf_counter(), _cycles()
    while time.perf_counter() - t0 < seconds:
        pass
    return (_cycles() - c0) / (time.perf_counter() - t0)


CHAINS = 12  # independent accumulators: more than FMA latency x ports, so throughput shows


@njit(parallel=True, cache=True)
def _fmas(n, a, threads):
    """n x CHAINS 16-lane FMAs on each thread; returns a sum so nothing is dropped"""
    total = np.zeros(threads, np.float32)
    for t in prange(threads):
        v = vbcast(a)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = vzero()
        for _ in range(n):
            a0, a1, a2, a3 = vfma(a0, v, v), vfma(a1, v, v), vfma(a2, v, v), vfma(a3, v, v)
            a4, a5, a6, a7 = vfma(a4, v, v), vfma(a5, v, v), vfma(a6, v, v), vfma(a7, v, v)
            a8, a9, a10, a11 = vfma(a8, v, v), vfma(a9, v, v), vfma(a10, v, v), vfma(a11, v, v)
        total[t] = (vsum(a0) + vsum(a1) + vsum(a2) + vsum(a3) + vsum(a4) + vsum(a5)
                    + vsum(a6) + vsum(a7) + vsum(a8) + vsum(a9) + vsum(a10) + vsum(a11))
    return total.sum()


def fma_peak(threads: int, n: int = 2_000_000, repeats: int = 5) -> float:
    """float32 multiply-adds per second over `threads` threads (median of repeats)"""
    a = np.float32(1e-7)
    _fmas(10, a, threads)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        _fmas(n, a, threads)
        rates.append(threads * CHAINS * LANES * n / (time.perf_counter() - t))
    return float(np.median(rates))


# ---------------------------------------------------------------- what each piece reads and does


def _work(model, n_tok: int, context: int) -> dict[str, tuple[int, int]]:
    """kind -> (bytes read, multiply-adds) of an n_tok forward at `context` cached positions"""
    cfg, w = model.config, model.weights
    layers = w.layers
    out = {}
    for kind, attr in (("qkv", "wqkv"), ("o", "wo"), ("gate_up", "w_gate_up"),
                       ("down", "w_down")):
        mats = [getattr(lw, attr) for lw in layers]
        out[kind] = (sum(m.nbytes for m in mats),
                     n_tok * sum(m.shape[0] * m.shape[1] for m in mats))
    out["head"] = (w.head.nbytes, n_tok * w.head.shape[0] * w.head.shape[1])
    positions = n_tok * context + n_tok * (n_tok + 1) // 2  # keys each row attends to, summed
    kv_row = 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # k and v of a position, float32
    out["attention"] = (len(layers) * (context + n_tok) * kv_row,
                        len(layers) * 2 * positions * cfg.num_attention_heads * cfg.head_dim)
    return out


# ---------------------------------------------------------------- the profile


def _profiled(tf, cache, ids, context: int) -> tuple[float, np.ndarray]:
    """(wall seconds, prof) of one forward of ids at `context` cached positions"""
    prof = clock.new_prof()
    cache.length = context
    t0 = time.perf_counter()
    tf.forward(ids, context, cache, prof=prof)
    return time.perf_counter() - t0, prof


def _forward_profile(model, n_tok: int, runs: list[tuple[float, np.ndarray]],
                     rate: float) -> ForwardProfile:
    """Medians over runs: each piece's time (a parallel piece's: its regions' spans), the time
    around the regions, and the rest of the wall time"""
    work = _work(model, n_tok, CONTEXT)
    wall = np.array([w for w, _ in runs]) * rate  # [repeats] in cycles
    profs = np.array([p for _, p in runs])  # [repeats, SLOTS]
    kinds = len(clock.KINDS)
    spans = profs[:, clock.SPANS:clock.SPANS + kinds]
    work_cycles = np.where(spans > 0, spans, profs[:, :kinds])  # [repeats, KINDS]
    ms = lambda cycles: 1e3 * float(np.median(cycles)) / rate  # noqa: E731
    pieces = [Piece(kind, ms(work_cycles[:, i]), *work.get(kind, (0, 0)))
              for i, kind in enumerate(clock.KINDS)]
    between = profs[:, :kinds].sum(axis=1) - work_cycles.sum(axis=1)
    pieces.append(Piece(BETWEEN, ms(between), 0, 0))
    pieces.append(Piece(REST, ms(wall - profs[:, :kinds].sum(axis=1)), 0, 0))
    return ForwardProfile(n_tok, ms(wall), int(profs[0, clock.REGIONS]), pieces)


def run_profile(model, threads: int, verify_tokens: int = 6, repeats: int = 20,
                bandwidth: float | None = None) -> ProfileResult:
    """A 1-token and a `verify_tokens`-token forward at CONTEXT cached positions, alternating,
    `repeats` times each (after one warm-up each), every piece stamped."""
    from kolibri_cli.bench.timing import measure_read_bandwidth
    from kolibri_cli.costs.store import cpu_model

    tf = model.transformer
    sizes = sorted({1, verify_tokens})
    cache = tf.new_cache(CONTEXT + max(sizes))
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, CONTEXT + max(sizes))
    tf.prefill(ids[:CONTEXT], 0, cache)
    runs: dict[int, list] = {n: [] for n in sizes}
    for n in sizes:
        _profiled(tf, cache, ids[CONTEXT:CONTEXT + n], CONTEXT)  # warm-up
    for _ in range(repeats):
        for n in sizes:
            runs[n].append(_profiled(tf, cache, ids[CONTEXT:CONTEXT + n], CONTEXT))
    rate = cycles_per_second()
    bandwidth = bandwidth or measure_read_bandwidth()
    return ProfileResult(
        model=model.name, numerics=model.numerics, threads=threads, cpu=cpu_model(),
        repeats=repeats, bandwidth_gb_s=bandwidth / 1e9, peak_gmacs=fma_peak(threads) / 1e9,
        forwards=[_forward_profile(model, n, runs[n], rate) for n in sizes])
