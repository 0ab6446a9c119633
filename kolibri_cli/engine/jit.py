"""numba settings shared by every compiled kernel: fastmath for reductions, thread count, and
the LLVM and OpenMP options that batch invariance and speed rely on."""

import os

import llvmlite.binding as llvm
import numba
import numpy as np

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
