"""Compile the kernel for a model while it is still being pulled, in a process of its own on the
other core. A kernel specialization depends on the weights' block types only
(engine/kernel.py `_specs`), so a tiny model of those types compiles exactly what the pulled one
then loads from numba's cache. The child reports numba's compile events on its stdout, one line
each, which the parent hands to its `Compiling` callback: the progress line shows the child's
work as its own.

Run as `python -m kolibri_cli.store.precompile TYPE...` (block type names, e.g. Q4_1 Q8_0).
"""

import subprocess
import sys
import threading

import numpy as np

from kolibri_cli.callbacks import Compiling


class Ahead:
    """A compile running in a child process; `wait` returns when it is done (or failed)."""

    def __init__(self, proc: subprocess.Popen, compiling: Compiling | None):
        self.proc = proc
        self.reader = threading.Thread(target=self._relay, args=(compiling,), daemon=True)
        self.reader.start()

    def _relay(self, compiling: Compiling | None) -> None:
        for line in self.proc.stdout:
            what, finished, under_way = (line.rstrip("\n").split("\t") + ["", "0", "0"])[:3]
            if compiling and finished.isdigit() and under_way.isdigit():
                compiling(what, int(finished), int(under_way))

    def wait(self) -> None:
        self.proc.wait()
        self.reader.join()


def start(types: tuple[str, ...], compiling: Compiling | None = None) -> Ahead | None:
    """The child compiling the lean kernel for `types`; None if it cannot start."""
    from kolibri_cli.store.cache import die_with_parent

    cmd = [sys.executable, "-I", "-m", "kolibri_cli.store.precompile", *types]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, text=True,
                                preexec_fn=die_with_parent())
    except OSError:
        return None  # the parent compiles instead, as without this
    return Ahead(proc, compiling)


def tiny_model(types: tuple[str, ...]):
    """(config, weights): one layer per 4 types (at least two: the layer list's append compiles
    too), every matrix zero blocks of one of `types`, each type in some matrix, the head tied to
    the embedding, D = F = 256 (a K-quant super-block a row)."""
    from kolibri_cli.engine import blocks
    from kolibri_cli.engine.config import ModelConfig
    from kolibri_cli.engine.weights import LayerWeights, Weights, stacked

    codes = [blocks.BY_NAME[t].code for t in types]
    n_layers = max(2, -(-(len(codes) - 1) // 4))
    config = ModelConfig(vocab_size=32, hidden_size=256, intermediate_size=256,
                         num_hidden_layers=n_layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=64)
    cycle = iter(codes * (4 * n_layers + 1))

    def matrix(rows: int, k: int):
        code = next(cycle)
        return stacked(code, k, [np.zeros((rows, blocks.TYPES[code].row_bytes(k)), np.uint8)])

    ones = np.ones(256, np.float32)
    layers = [LayerWeights(attn_norm=ones, wqkv=matrix(512, 256), wo=matrix(256, 256),
                           mlp_norm=ones, w_gate_up=matrix(512, 256), w_down=matrix(256, 256))
              for _ in range(n_layers)]
    embed = matrix(32, 256)
    return config, Weights(embed=embed, layers=layers, norm=ones, head=embed)


def main(types: list[str]) -> None:
    from kolibri_cli.engine.jit import compile_events
    from kolibri_cli.engine.kernel import Transformer

    def report(what: str, finished: int, under_way: int) -> None:
        print(f"{what}\t{finished}\t{under_way}", flush=True)

    config, weights = tiny_model(tuple(types))
    with compile_events(report):
        Transformer(config, weights).warm_up(("lean",))


if __name__ == "__main__":
    main(sys.argv[1:])
