"""Benchmark: n-gram proposer time per call at long contexts (not a test; prints figures).

    .venv/bin/python probes/proposer_bench.py [--context 8192] [--repeats 2000]

Contexts: random ids over a 49152-token vocabulary (suffix rarely matches: the scan runs to the
end), a small 50-token alphabet (many partial matches: KMP fallbacks), and a periodic text (the
suffix matches everywhere). Reported: median and p90 microseconds per `propose` call, and the
ratio to a 1-token decode step of the default model (~35 ms at ~29 tok/s) for scale.
"""

import argparse
import statistics
import time

import numpy as np

from kolibri_cli.decode.proposers import NgramProposer

DECODE_STEP_S = 1 / 29  # the default model's plain float32 decode step, first machine


def contexts(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    period = rng.integers(0, 49152, size=37)
    return {
        "random, vocab 49152": rng.integers(0, 49152, size=n),
        "random, vocab 50": rng.integers(0, 50, size=n),
        "periodic (37)": np.tile(period, n // 37 + 1)[:n],
    }


def time_calls(proposer: NgramProposer, context, repeats: int) -> list[float]:
    proposer.propose(context, proposer.k)  # compile / load the numba cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        proposer.propose(context, proposer.k)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for window in ((1, 4), (3, 5), (5, 5)):
        proposer = NgramProposer(5, *window)
        for name, ids in contexts(args.context, rng).items():
            for kind, context in (("ndarray", ids.astype(np.int64)), ("list", ids.tolist())):
                times = time_calls(proposer, context, args.repeats)
                median = statistics.median(times)
                p90 = statistics.quantiles(times, n=10)[-1]
                print(
                    f"{proposer.name} k=5 window={window[0]}-{window[1]}  T={args.context} "
                    f"{name:20s} {kind:7s} "
                    f"median {median * 1e6:8.1f} us  p90 {p90 * 1e6:8.1f} us  "
                    f"= {median / DECODE_STEP_S:.2%} of a decode step"
                )


if __name__ == "__main__":
    main()
