"""numba settings shared by every compiled kernel: fastmath for reductions, thread count, and
the LLVM and OpenMP options that batch invariance and speed rely on."""

import os
from contextlib import contextmanager

import llvmlite.binding as llvm
import numba
import numpy as np
from numba.core import event

from kolibri_cli.callbacks import Compiling
from kolibri_cli.engine import jitcache  # noqa: F401  (before any kernel is defined)
from kolibri_cli.errors import KolibriError

# libgomp reads this once, when numba starts its OpenMP threads (the first parallel call, not an
# import). Its default spins each idle thread ~300k times at each of the ~150 barriers per forward:
# with another process busy on one core, 2 threads then took ~1.1 s per token instead of 12 ms.
# 1000 spins cost nothing measurable on an idle machine and keep a busy one at ~30 ms per token.
# A value set in the environment wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

REDUCE = {"reassoc", "contract"}  # fastmath for order-free reductions (a max): no nnan/ninf/afn
ONE = np.float32(1.0)
ZERO = np.float32(0.0)

# Every vectorized reduction loop gets one accumulator vector per sum (no interleaving). kolibri's
# sums are written out in a fixed order now (simd, attention), so this guards any loop left to
# the vectorizer; it also shapes the code (and speed) of the kernel as measured. Set before any
# kernel compiles; process-wide, but it only costs speed in other numba code, never results.
llvm.set_option("", "-force-vector-interleave=1")


def set_threads(n: int) -> None:
    """Use n threads for the parallel kernels (the `--threads` option)."""
    if n < 1 or n > numba.config.NUMBA_NUM_THREADS:
        raise KolibriError(f"--threads must be 1..{numba.config.NUMBA_NUM_THREADS}, got {n}")
    numba.set_num_threads(n)


def get_threads() -> int:
    return numba.get_num_threads()


def start_threads() -> None:
    """Start numba's thread pool; call before the first kernel call.

    numba saves a function compiled from parallel parts it loaded from its disk cache without
    the hook that starts the pool. Loaded into a fresh process, such a kernel jumps into an
    unstarted pool at its first parallel loop: SIGSEGV (the crash of a second model shape, or of
    any kernel compiled after its parts were cached on their own, e.g. by a test).
    `numba.get_num_threads()` starts the pool."""
    numba.get_num_threads()


class _CompileListener(event.Listener):
    """numba's "numba:compile" events -> on_compile(what, finished, under way), `what` the
    innermost kolibri function being compiled (numba's helpers it compiles on the way are
    counted, but named by the kolibri function that needs them)."""

    def __init__(self, on_compile: Compiling):
        self.on_compile, self.stack, self.finished = on_compile, [], 0

    def on_start(self, ev) -> None:
        self.stack.append(_name(ev.data["dispatcher"].py_func))
        self._report()

    def on_end(self, ev) -> None:
        self.stack.pop()
        self.finished += 1
        self._report()

    def _report(self) -> None:
        ours = [n for n in self.stack if n]
        self.on_compile(ours[-1] if ours else "", self.finished, len(self.stack))


def _name(func) -> str:
    """`matmul._parallel` for a kolibri function, "" for numba's own."""
    module = getattr(func, "__module__", "") or ""
    if not module.startswith("kolibri_cli."):
        return ""
    return f"{module.rsplit('.', 1)[-1]}.{func.__qualname__.replace('.<locals>', '')}"


@contextmanager
def compile_events(on_compile: Compiling | None):
    """Within the block, on_compile(what, finished, under way) at every start and end of a numba
    compile (a cache hit is no compile and says nothing): progress driven by what numba does,
    not by a clock."""
    if on_compile is None:
        yield
        return
    listener = _CompileListener(on_compile)
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
