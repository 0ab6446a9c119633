"""Where a forward's time goes on the default model: its GGUF blocks against the same weights
decoded to float32 rows (the float32 path), in alternating rounds, wall and CPU seconds.

CPU seconds per forward are the figure to read on a loaded machine: wall time then measures the
other processes, CPU time mostly the work (on an idle machine the two agree, times threads).

1. Each matmul kind of layer 0 alone (1 token; its weights stay in cache between calls, so
   this is the decode arithmetic, not memory), and the head (streamed from memory).
2. Whole forwards of 1 and n tokens at a 100-token context, both storages: c(n) by wall and
   by CPU time, and the float32 / blocks ratio.

    .venv/bin/python probes/block_profile.py [--threads 2] [--repeats 15] [--n 6]
    .venv/bin/python probes/block_profile.py --n 2,3,4,5,6,7,8 --skip-kinds   # c(n) curve
"""

import argparse
import time

import numpy as np

from kolibri_cli.engine import blockfile
from kolibri_cli.engine import matmul as mm
from kolibri_cli.engine.jit import set_threads
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import layout
from kolibri_cli.store.models import open_model


def timed(f) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - w, time.process_time() - c


def median_times(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return float(np.median([w for w, _ in runs])), float(np.median([c for _, c in runs]))


def matmul_kinds(model, repeats: int) -> None:
    cfg, lw = model.config, model.weights.layers[0]
    rng = np.random.default_rng(0)
    d, f = cfg.hidden_size, cfg.intermediate_size
    x = rng.standard_normal((1, d)).astype(np.float32)
    a = rng.standard_normal((1, f)).astype(np.float32)
    tmp, h = np.empty((1, d), np.float32), np.zeros((1, d), np.float32)
    qkv = np.empty((1, mm.n_rows(lw.wqkv.arrays())), np.float32)
    gu, act = np.empty((1, 2 * f), np.float32), np.empty((1, f), np.float32)
    head = model.weights.head
    logits = np.empty((1, mm.n_rows(head.arrays())), np.float32)
    kinds = {
        "qkv": (lambda: mm.matmul(x, lw.wqkv.arrays(), qkv), lw.wqkv),
        "o": (lambda: mm.matmul_add(x, lw.wo.arrays(), tmp, h), lw.wo),
        "gate_up": (lambda: mm.gate_up_silu(x, lw.w_gate_up.arrays(), gu, act), lw.w_gate_up),
        "down": (lambda: mm.matmul_add(a, lw.w_down.arrays(), tmp, h), lw.w_down),
        "head": (lambda: mm.matmul(x, head.arrays(), logits), head),
    }
    print("matmul (1 token)   types        MB     wall us   cpu us   GB/s by cpu")
    for name, (f, m) in kinds.items():
        f()
        w, c = median_times([timed(f) for _ in range(repeats * 4)])
        print(f"{name:18s} {','.join(m.types):10s} {m.nbytes / 1e6:6.2f} {1e6 * w:10.1f} "
              f"{1e6 * c:8.1f} {m.nbytes / c / 1e9:8.1f}")


def forwards(model, repeats: int, ns: list[int]) -> None:
    twin = Transformer(model.config, layout(model.config, blockfile.float_tensors(
        model.path / blockfile.NAME)))
    paths = {"blocks": model.transformer, "float32": twin}
    sizes = [1, *ns]
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 100 + max(sizes))
    caches = {}
    for name, tf in paths.items():
        caches[name] = tf.new_cache(100 + max(sizes))
        tf.forward(ids[:100], 0, caches[name])
    runs = {(name, L): [] for name in paths for L in sizes}
    for _ in range(repeats):  # alternate: load changes hit both alike
        for name, tf in paths.items():
            for L in sizes:
                cache = caches[name]

                def step(tf=tf, cache=cache, L=L):
                    cache.length = 100
                    tf.forward(ids[100:100 + L], 100, cache)

                runs[(name, L)].append(timed(step))
    med = {k: median_times(v) for k, v in runs.items()}
    print("\nforward at 100 cached   L   wall ms   cpu ms")
    for (name, L), (w, c) in med.items():
        print(f"{name:22s} {L:3d} {1e3 * w:9.2f} {1e3 * c:8.2f}")
    for name in paths:
        (w1, c1) = med[(name, 1)]
        for n in ns:
            wn, cn = med[(name, n)]
            print(f"{name}: c({n}) = {wn / w1:.2f} by wall, {cn / c1:.2f} by cpu")
    (wb, cb), (wf, cf) = med[("blocks", 1)], med[("float32", 1)]
    print(f"1-token forward, float32 / blocks: {wf / wb:.2f}x by wall, {cf / cb:.2f}x by cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--n", default="6", help="tokens of the verify-sized forwards, e.g. 2,4,6")
    ap.add_argument("--skip-kinds", action="store_true", help="forwards only")
    args = ap.parse_args()
    set_threads(args.threads)
    model = open_model(None)
    if not args.skip_kinds:
        matmul_kinds(model, args.repeats)
    forwards(model, args.repeats, [int(n) for n in args.n.split(",")])


if __name__ == "__main__":
    main()
