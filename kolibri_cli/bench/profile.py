"""`kolibri bench --profile`: where one forward's time goes, piece by piece, against the two
physical limits — the memory-bandwidth bound of the bytes the piece reads and this host's vector
peak for the multiply-adds it does (float32 FMAs; on the int16 path, `vpmaddwd`'s int16
multiply-adds).

The kernel itself stamps its pieces (engine/clock.py): each matmul kind (q/k/v, o, gate/up,
down, the head), attention, norms, RoPE with the cache writes, the embedding lookup, and for
every parallel region the span from the first thread's start of work to the last one's end. A
piece's time minus the spans of its regions is the cost of starting and joining the threads
("fork/join"). The forwards profiled are the ones decoding runs: 1 token (plain decode) and T
tokens (a verify pass; SIZES: T = 2..8, 16 and 64, the c(T) curve), all at a 100-token context,
alternating, medians of repeats.

The c(T) curve (`cost_rows`): each forward's time over the 1-token one's, with the matmuls'
multiply-adds/s and bytes/s against the path's multiply-add peak and the read bandwidth.

Non-goals: per-layer figures (every layer has the same shapes), prefill, a per-thread timeline.
"""

import time
from dataclasses import asdict, dataclass

import numpy as np
from numba import njit, prange

from kolibri_cli.engine import clock
from kolibri_cli.engine.simd import vbcast, vfma, vsum, vzero
from kolibri_cli.engine.simd8 import vadd32, vcvt8, vmadd16, vsum8, xload

CONTEXT = 100  # cached positions when the forwards are timed (as c(n) is)
LANES = 16  # float32 lanes of one vfma; int16 multiply-adds of one vmadd16
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 64)  # tokens per profiled forward: the c(T) curve
MATMULS = ("qkv", "o", "gate_up", "down", "head")


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
    int_peak_gmacs: float  # int16 multiply-adds per second (vmadd16 + vadd32), all threads (G)
    forwards: list[ForwardProfile]

    @property
    def bound_gmacs(self) -> float:
        """The multiply-add peak of this numeric path (int16's integer one, else float32's)"""
        return self.int_peak_gmacs if self.numerics == "int16" else self.peak_gmacs

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


def _peak(kernel, operand, threads: int, n: int, repeats: int) -> float:
    """Multiply-adds per second of `kernel(n, operand, threads)` (median of repeats, after a
    short warm call that compiles it)"""
    kernel(10, operand, threads)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        kernel(n, operand, threads)
        rates.append(threads * CHAINS * LANES * n / (time.perf_counter() - t))
    return float(np.median(rates))


def fma_peak(threads: int, n: int = 2_000_000, repeats: int = 5) -> float:
    """float32 multiply-adds per second over `threads` threads (median of repeats)"""
    return _peak(_fmas, np.float32(1e-7), threads, n, repeats)


WORDS = 1024  # int16 codes _imadds reads (2 KiB: L1), 16 a multiply-add


@njit(parallel=True, cache=True)
def _imadds(n, w, threads):
    """n x CHAINS int16 multiply-adds of 16 lanes on each thread, each of a v and codes loaded
    from w (L1) and summed into an int32 accumulator, as the int16 tiles do; returns a sum so
    nothing is dropped (fresh loads: a product of invariant vectors would leave the loop)"""
    total = np.zeros(threads, np.float32)
    for t in prange(threads):
        v = xload(w, 0)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = vmadd16(v, v)
        for i in range(n):
            e = i * CHAINS * LANES % (WORDS - CHAINS * LANES)
            a0 = vadd32(a0, vmadd16(v, xload(w, e)))
            a1 = vadd32(a1, vmadd16(v, xload(w, e + 16)))
            a2 = vadd32(a2, vmadd16(v, xload(w, e + 32)))
            a3 = vadd32(a3, vmadd16(v, xload(w, e + 48)))
            a4 = vadd32(a4, vmadd16(v, xload(w, e + 64)))
            a5 = vadd32(a5, vmadd16(v, xload(w, e + 80)))
            a6 = vadd32(a6, vmadd16(v, xload(w, e + 96)))
            a7 = vadd32(a7, vmadd16(v, xload(w, e + 112)))
            a8 = vadd32(a8, vmadd16(v, xload(w, e + 128)))
            a9 = vadd32(a9, vmadd16(v, xload(w, e + 144)))
            a10 = vadd32(a10, vmadd16(v, xload(w, e + 160)))
            a11 = vadd32(a11, vmadd16(v, xload(w, e + 176)))
        a0 = vadd32(vadd32(vadd32(a0, a1), vadd32(a2, a3)), vadd32(vadd32(a4, a5), a6))
        a7 = vadd32(vadd32(vadd32(a7, a8), vadd32(a9, a10)), a11)
        total[t] = vsum8(vcvt8(vadd32(a0, a7)))
    return total.sum()


def int_peak(threads: int, n: int = 2_000_000, repeats: int = 5) -> float:
    """int16 multiply-adds per second over `threads` threads (median of repeats)"""
    w = np.ones(WORDS, np.int16)  # products of ones: the sums stay far from overflow
    return _peak(_imadds, w, threads, n, repeats)


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


def run_profile(model, threads: int, sizes=SIZES, repeats: int = 20,
                bandwidth: float | None = None) -> ProfileResult:
    """A forward of each of `sizes` tokens at CONTEXT cached positions, in turn, `repeats` times
    each (after one warm-up each), every piece stamped."""
    from kolibri_cli.bench.timing import measure_read_bandwidth
    from kolibri_cli.costs.store import cpu_model

    tf = model.transformer
    sizes = sorted(set(sizes) | {1})
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
        int_peak_gmacs=int_peak(threads) / 1e9,
        forwards=[_forward_profile(model, n, runs[n], rate) for n in sizes])


def cost_rows(r: ProfileResult) -> list[dict]:
    """Per forward: T, ms, c(T), each matmul kind's, attention's and the between-regions ms,
    and all matmuls together as G multiply-adds/s, GB/s and the fraction of the bound (the
    slower of the path's multiply-add peak and the read bandwidth) they reach."""
    one = next(f.ms for f in r.forwards if f.tokens == 1)
    rows = []
    for f in r.forwards:
        by = {p.kind: p for p in f.pieces}
        mm = [by[k] for k in MATMULS]
        ms, macs, nbytes = sum(p.ms for p in mm), sum(p.macs for p in mm), sum(
            p.bytes for p in mm)
        bound = max(nbytes / (r.bandwidth_gb_s * 1e9), macs / (r.bound_gmacs * 1e9))
        rows.append({"tokens": f.tokens, "ms": f.ms, "cost": f.ms / one,
                     **{k: by[k].ms for k in (*MATMULS, "attention", BETWEEN)},
                     "other": f.ms - ms - by["attention"].ms - by[BETWEEN].ms,
                     "matmul_gmacs": macs / ms / 1e6, "matmul_gb_s": nbytes / ms / 1e6,
                     "of_bound": 1e3 * bound / ms})
    return rows
