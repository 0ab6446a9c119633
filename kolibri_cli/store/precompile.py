"""Compile the kernel for a model while it is still being pulled, in processes of their own. A
kernel specialization depends on the weights' block types only (engine/kernel.py `_specs`), so a
tiny model of those types compiles exactly what the pulled one then loads from numba's cache.
With two cores, two children compile a half each (engine/kernel.py `compile_half`; numba caches
each function apart), then the "rest" child, told that the "matmul" one is done, compiles the
kernel itself, which links the halves from the cache. The children report numba's compile events
on their stdout, one line each, which the parent sums and hands to its `Compiling` callback: the
progress line shows the children's work as its own.

Run as `python -m kolibri_cli.store.precompile [--half matmul|rest] TYPE...` (block type names,
the embedding's first, e.g. Q8_0 Q4_1, or the int16 path's Q8_0 Q8_0x16 Q4_1x16); "rest" waits
for a line on stdin before it compiles the kernel.
"""

import os
import subprocess
import sys
import threading

import numpy as np

from kolibri_cli.callbacks import Compiling


class Ahead:
    """Compiles running in child processes; `wait` returns when they are done (or failed)."""

    def __init__(self, procs: list[subprocess.Popen], compiling: Compiling | None):
        self.procs, self.compiling = procs, compiling
        self.counts = [(0, 0)] * len(procs)  # per child: (compiles finished, under way)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._relay, args=(i,), daemon=True)
                        for i in range(len(procs))]
        for thread in self.threads:
            thread.start()

    @property
    def proc(self) -> subprocess.Popen:
        """The child that compiles the kernel itself (the last one)."""
        return self.procs[-1]

    def _relay(self, i: int) -> None:
        for line in self.procs[i].stdout:
            what, finished, under_way = (line.rstrip("\n").split("\t") + ["", "0", "0"])[:3]
            if finished.isdigit() and under_way.isdigit():
                self._report(i, what, int(finished), int(under_way))
        self.procs[i].wait()
        if i == 0 and len(self.procs) > 1:
            _go(self.procs[1])  # the matmul half is in the cache (or failed): compile the kernel

    def _report(self, i: int, what: str, finished: int, under_way: int) -> None:
        with self.lock:
            self.counts[i] = (finished, under_way)
            if self.compiling:
                self.compiling(what, sum(f for f, _ in self.counts),
                               sum(u for _, u in self.counts))

    def wait(self) -> None:
        for proc, thread in zip(self.procs, self.threads, strict=True):
            proc.wait()
            thread.join()


def _go(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.write("go\n")
        proc.stdin.close()
    except OSError:  # it ended already
        pass


def start(types: tuple[str, ...], compiling: Compiling | None = None) -> Ahead | None:
    """The children compiling the lean kernel for `types` (two halves on two cores, else one
    child for all); None if they cannot start."""
    halves = ("matmul", "rest") if _cores() >= 2 else ("",)  # engine/kernel.py HALVES
    procs = []
    for half in halves:
        if (proc := _child(types, half)) is None:
            for p in procs:
                p.kill()
            return None  # the parent compiles instead, as without this
        procs.append(proc)
    return Ahead(procs, compiling)


def _child(types: tuple[str, ...], half: str) -> subprocess.Popen | None:
    from kolibri_cli.store.cache import die_with_parent

    cmd = [sys.executable, "-I", "-m", "kolibri_cli.store.precompile",
           *(["--half", half] if half else []), *types]
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.PIPE if half == "rest" else subprocess.DEVNULL,
                                text=True, preexec_fn=die_with_parent())
    except OSError:
        return None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def tiny_model(types: tuple[str, ...]):
    """(config, weights): one layer per 4 types (at least two: the layer list's append compiles
    too), every matrix zero blocks of one of `types`, each type in some matrix, the embedding of
    the first (engine.weights.kernel_types: an integer path's repacked types are never looked up)
    and the head tied to it, D = F = 256 (a K-quant super-block a row)."""
    from kolibri_cli.engine import blocks
    from kolibri_cli.engine.config import ModelConfig
    from kolibri_cli.engine.weights import LayerWeights, Weights, stacked

    codes = [blocks.BY_NAME[t].code for t in types]
    n_layers = max(2, -(-(len(codes) - 1) // 4))
    config = ModelConfig(vocab_size=32, hidden_size=256, intermediate_size=256,
                         num_hidden_layers=n_layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=64)
    cycle = iter(codes * 4 * n_layers)

    def matrix(rows: int, k: int, code: int | None = None):
        code = next(cycle) if code is None else code
        return stacked(code, k, [np.zeros((rows, blocks.TYPES[code].row_bytes(k)), np.uint8)])

    ones = np.ones(256, np.float32)
    layers = [LayerWeights(attn_norm=ones, wqkv=matrix(512, 256), wo=matrix(256, 256),
                           mlp_norm=ones, w_gate_up=matrix(512, 256), w_down=matrix(256, 256))
              for _ in range(n_layers)]
    embed = matrix(32, 256, codes[0])
    return config, Weights(embed=embed, layers=layers, norm=ones, head=embed)


def main(args: list[str]) -> None:
    from kolibri_cli.engine.jit import compile_events
    from kolibri_cli.engine.kernel import Transformer, compile_half

    def report(what: str, finished: int, under_way: int) -> None:
        print(f"{what}\t{finished}\t{under_way}", flush=True)

    half = args[1] if args[:1] == ["--half"] else ""
    config, weights = tiny_model(tuple(args[2:] if half else args))
    with compile_events(report):
        if half:
            compile_half(config, weights, half)
        if half == "matmul":
            return
        if half == "rest":
            print("waiting", flush=True)  # for the matmul half (not an event: the parent skips it)
            sys.stdin.readline()  # the matmul half is done: the kernel loads it from the cache
        Transformer(config, weights).warm_up(("lean",))


if __name__ == "__main__":
    main(sys.argv[1:])
