"""Forward-kernel benchmark at SmolLM2-135M shapes with random weights (no checkpoint needed).

Prints ms per forward for L = 1..8 at a ~100-token context, c(n) = time(n)/time(1) from the same
interleaved run, the measured read bandwidth, the bandwidth bound of a 1-token forward
(weight bytes / bandwidth) and the fraction of it reached. Medians of repeats; bandwidth and
forwards are measured in alternating rounds. 2 threads by default.

    .venv/bin/python probes/kernel_bench.py [--threads 2] [--repeats 15] [--layers 30]
"""

import argparse
import sys
import time

import numpy as np

from kolibri_cli.bench import timing as bench
from kolibri_cli.costs import timing
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.jit import set_threads
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights


def smollm2_135m(n_layers: int) -> ModelConfig:
    return ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=n_layers, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, rope_theta=100000.0, max_position_embeddings=8192,
                       tie_word_embeddings=True)


def measure_interleaved(model, a) -> tuple[float, dict[int, float]]:
    """Bandwidth and forward times in alternating rounds, so machine noise hits both alike."""
    rounds = max(1, a.repeats // 3)
    bws, runs = [], []
    for _ in range(rounds):
        bws.append(bench.measure_read_bandwidth(repeats=3))
        runs.append(timing.forward_times(model, a.max_n, a.context, repeats=3))
    times = {n: float(np.median([r[n] for r in runs])) for n in runs[0]}
    return float(np.median(bws)), times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--context", type=int, default=100)
    p.add_argument("--max-n", type=int, default=8)
    a = p.parse_args()
    set_threads(a.threads)
    config = smollm2_135m(a.layers)
    weights = random_weights(config)
    model = Transformer(config, weights)
    t0 = time.perf_counter()
    model.forward([1], 0, model.new_cache(4))
    startup = time.perf_counter() - t0
    print(f"first forward (compile or cache load): {startup:.2f} s", file=sys.stderr)
    bandwidth, times = measure_interleaved(model, a)
    bound = weights.nbytes_per_token() / bandwidth
    print(f"threads {a.threads}, layers {a.layers}, context {a.context}, "
          f"repeats {a.repeats} (medians)")
    print(" L   ms/forward   c(L)")
    for n, c in timing.costs(times).items():
        print(f"{n:2d}   {times[n] * 1e3:9.2f}   {c:5.2f}")
    print(f"read bandwidth      {bandwidth / 1e9:.1f} GB/s")
    print(f"weights per token   {weights.nbytes_per_token() / 1e6:.0f} MB")
    print(f"bandwidth bound     {bound * 1e3:.2f} ms per 1-token forward ({1 / bound:.1f} tok/s)")
    print(f"fraction reached    {bound / times[1]:.2f}  (1-token forward {1 / times[1]:.1f} tok/s)")


if __name__ == "__main__":
    main()
