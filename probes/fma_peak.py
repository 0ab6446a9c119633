"""The machine's float32 FMA peak with kolibri's own vector ops, and what it implies for c(n).

Each extra token of a forward costs one float32 fused multiply-add per weight (batch
invariance: every (row, token) product is its own FMA in the fixed order), so an n-token forward
takes at least t(1) + (n-1) * weights / (16 * peak 16-lane FMAs per second). With the measured
1-token time this gives the smallest c(n) the float32 path's order allows.

    .venv/bin/python probes/fma_peak.py [--threads 2] [--weights 134.5e6] [--t1-ms 5.0]
"""

import argparse

from kolibri_cli.bench.profile import fma_peak
from kolibri_cli.engine.jit import set_threads, start_threads

LANES = 16


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
    rate = fma_peak(args.threads) / LANES  # 16-lane FMAs per second
    per_token = args.weights / 16 / rate
    print(f"FMA peak ({args.threads} threads): {rate / 1e9:.2f} G 16-lane FMA/s "
          f"= {32 * rate / 1e9:.0f} GFLOP/s")
    print(f"one float32 FMA per weight: {1e3 * per_token:.3f} ms per extra token at peak")
    if args.t1_ms:
        low = 1 + (args.n - 1) * 1e3 * per_token / args.t1_ms
        print(f"with t(1) = {args.t1_ms:.2f} ms: c({args.n}) >= {low:.2f}")


if __name__ == "__main__":
    main()
