"""The int8 numeric path's matmuls against the float32 path's, on the default model's own matrices.

Part 1, whole forwards (what decode and verify cost): L = 1 and L = 6 tokens at a 100-token
context, the model's blocks (float32 path) against the same blocks repacked for the int8 path.
Part 2, each matmul kind alone (called in a compiled loop over the layers' matrices):

Each kind (QKV, o, gate/up + SiLU, down: all 30 layers' matrices in turn, so the weights stream
from memory as in a forward; the head once) runs with L = 1 and L = 6 tokens on both paths, in
alternating rounds; the median wall time per call and the ratio float32 / int8 are printed.
The int8 matrices are the model's Q4_1 and Q8_0 blocks repacked (`weights.int8_matrix`).

    .venv/bin/python benchmarks/int8_matvec.py [--threads 2] [--repeats 15] [--tokens 1,6]
"""

import argparse
import time
from dataclasses import replace

import numpy as np
from numba import njit
from numba.typed import List

from kolibri_cli.engine import matmul as mm
from kolibri_cli.engine.jit import set_threads
from kolibri_cli.engine.weights import int8_matrix, int8_weights
from kolibri_cli.store.models import open_model


@njit
def _loop(kind, x, mats, out, dest):
    """Each matrix once (in numba: no Python call overhead per matrix)"""
    for m in mats:
        if kind == 0:
            mm.matmul(x, m, out)
        elif kind == 1:
            mm.matmul_add(x, m, out, dest)
        else:
            mm.gate_up_silu(x, m, out, dest)


def kinds(weights, L: int, d: int, f: int, cached: bool):
    """name -> (kind, x, out, dest, matrices) for L tokens; `cached`: layer 0's matrices 30
    times (they stay in L2/L3: the arithmetic, not the memory)"""
    rng = np.random.default_rng(L)
    x = rng.standard_normal((L, d)).astype(np.float32)
    a = rng.standard_normal((L, f)).astype(np.float32)
    tmp, h = np.empty((L, d), np.float32), np.zeros((L, d), np.float32)
    qkv = np.empty((L, weights.layers[0].wqkv.shape[0]), np.float32)
    gu, act = np.empty((L, 2 * f), np.float32), np.empty((L, f), np.float32)
    logits = np.empty((L, weights.head.shape[0]), np.float32)
    if cached:
        weights = replace(weights, layers=weights.layers[:1] * len(weights.layers))
    layers = weights.layers
    return {
        "qkv": (0, x, qkv, qkv, [lw.wqkv for lw in layers]),
        "o": (1, x, tmp, h, [lw.wo for lw in layers]),
        "gate_up": (2, x, gu, act, [lw.w_gate_up for lw in layers]),
        "down": (1, a, tmp, h, [lw.w_down for lw in layers]),
        "head": (0, x, logits, logits, [weights.head]),
    }


def forwards(model, repeats: int, sizes: list[int]) -> None:
    from kolibri_cli.engine.kernel import Transformer

    paths = {"float32": model.transformer,
             "int8": Transformer(model.config, int8_weights(model.weights))}
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 100 + max(sizes))
    caches = {name: tf.new_cache(100 + max(sizes)) for name, tf in paths.items()}
    for name, tf in paths.items():
        tf.forward(ids[:100], 0, caches[name])
    runs = {(name, L): [] for name in paths for L in sizes}
    for _ in range(repeats):
        for name, tf in paths.items():
            for L in sizes:
                caches[name].length = 100
                t = time.perf_counter()
                tf.forward(ids[100:100 + L], 100, caches[name])
                runs[(name, L)].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in runs.items()}
    print("forward at 100 cached   L   ms (median)")
    for (name, L), t in med.items():
        print(f"{name:22s} {L:3d} {1e3 * t:9.2f}")
    for L in sizes:
        print(f"L={L}: float32 / int8 = {med[('float32', L)] / med[('int8', L)]:.2f}x")
    for name in paths:
        print(f"{name}: c({max(sizes)}) = {med[(name, max(sizes))] / med[(name, 1)]:.2f}")


def timed(kind, x, out, dest, mats) -> float:
    t = time.perf_counter()
    _loop(kind, x, mats, out, dest)
    return (time.perf_counter() - t) / len(mats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tokens", default="1,6")
    ap.add_argument("--cached", action="store_true",
                    help="matmul kinds on layer 0's matrices only (in cache: compute, not memory)")
    ap.add_argument("--skip-forwards", action="store_true")
    args = ap.parse_args()
    set_threads(args.threads)
    model = open_model(None)
    weights = model.weights
    if not args.skip_forwards:
        forwards(model, args.repeats, [int(n) for n in args.tokens.split(",")])
    cfg_d, cfg_f = weights.layers[0].wo.shape[0], weights.layers[0].w_down.shape[1]
    converted = {}
    print(f"threads {args.threads}, repeats {args.repeats}, median us per matrix call")
    print("kind      L  types           MB/matrix   float32 us   int8 us   float32/int8")
    totals = {}
    for L in [int(n) for n in args.tokens.split(",")]:
        for name, (kind, x, out, dest, mats) in kinds(weights, L, cfg_d, cfg_f,
                                                       args.cached).items():
            pair = [List([m.arrays() for m in mats]),
                    List([converted.setdefault(id(m), int8_matrix(m)).arrays() for m in mats])]
            for p in pair:
                timed(kind, x, out, dest, p)  # compile and warm
            runs = [[], []]
            for _ in range(args.repeats):
                for i, p in enumerate(pair):
                    runs[i].append(timed(kind, x, out, dest, p))
            f32, i8 = (float(np.median(r)) for r in runs)
            n = len(mats)
            totals[L] = [t + n * v for t, v in zip(totals.get(L, [0.0, 0.0]), (f32, i8),
                                                   strict=True)]
            m8 = converted[id(mats[0])]
            print(f"{name:8s} {L:2d}  {','.join(mats[0].types):5s}->{','.join(m8.types):8s} "
                  f"{mats[0].nbytes / 1e6:9.2f} {1e6 * f32:12.1f} {1e6 * i8:9.1f} "
                  f"{f32 / i8:10.2f}x")
    for L, (f32, i8) in totals.items():
        print(f"all matmuls of a forward, L={L}: float32 {1e3 * f32:.2f} ms, int8 {1e3 * i8:.2f} "
              f"ms, {f32 / i8:.2f}x")


if __name__ == "__main__":
    main()
