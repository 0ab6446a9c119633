"""The machine's float32 FMA peak with kolibri's own vector ops, and what it implies for c(n).

Each extra token of a forward costs one float32 fused multiply-add per weight (batch
invariance: every (row, token) product is its own FMA in the fixed order), so an n-token forward
takes at least t(1) + (n-1) * weights / (16 * peak 16-lane FMAs per second). With the measured
1-token time this gives the smallest c(n) the float32 path's order allows.

    .venv/bin/python probes/fma_peak.py [--threads 2] [--weights 134.5e6] [--t1-ms 5.0]
"""

import argparse
import time

import numpy as np
from numba import njit, prange

from kolibri_cli.engine.jit import set_threads, start_threads
from kolibri_cli.engine.simd import vbcast, vfma, vsum, vzero

CHAINS = 12  # independent accumulators: more than latency x FMA ports, so throughput shows


@njit(parallel=True)
def _fmas(n, a):
    """n x CHAINS 16-lane FMAs on each of the threads; returns a sum so nothing is dropped"""
    total = np.zeros(64, np.float32)
    for t in prange(64):
        v = vbcast(a)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = vzero()
        for _ in range(n):
            a0, a1, a2, a3 = vfma(a0, v, v), vfma(a1, v, v), vfma(a2, v, v), vfma(a3, v, v)
            a4, a5, a6, a7 = vfma(a4, v, v), vfma(a5, v, v), vfma(a6, v, v), vfma(a7, v, v)
            a8, a9, a10, a11 = vfma(a8, v, v), vfma(a9, v, v), vfma(a10, v, v), vfma(a11, v, v)
        total[t] = (vsum(a0) + vsum(a1) + vsum(a2) + vsum(a3) + vsum(a4) + vsum(a5)
                    + vsum(a6) + vsum(a7) + vsum(a8) + vsum(a9) + vsum(a10) + vsum(a11))
    return total.sum()


def peak(n: int = 4_000_000, repeats: int = 5) -> float:
    """16-lane FMAs per second over all threads (the median of `repeats`)"""
    a = np.float32(1e-7)
    _fmas(10, a)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        _fmas(n, a)
        rates.append(64 * CHAINS * n / (time.perf_counter() - t))
    return float(np.median(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", type=float, default=134.5e6,
                    help="weights per token (the default model: 134.5M)")
    ap.add_argument("--t1-ms", type=float, help="a measured 1-token forward, ms")
    ap.add_argument("--n", type=int, default=6)
    args = ap.parse_args()
    set_threads(args.threads)
    start_threads()
    rate = peak()
    per_token = args.weights / 16 / rate
    print(f"FMA peak ({args.threads} threads): {rate / 1e9:.2f} G 16-lane FMA/s "
          f"= {32 * rate / 1e9:.0f} GFLOP/s")
    print(f"one float32 FMA per weight: {1e3 * per_token:.3f} ms per extra token at peak")
    if args.t1_ms:
        low = 1 + (args.n - 1) * 1e3 * per_token / args.t1_ms
        print(f"with t(1) = {args.t1_ms:.2f} ms: c({args.n}) >= {low:.2f}")


if __name__ == "__main__":
    main()
