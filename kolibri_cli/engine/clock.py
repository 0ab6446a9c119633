"""A cycle clock inside compiled code, for `kolibri bench --profile`: the kernel stamps the time
each piece of a forward takes into an int64 array `prof` when one is given (a zero-length array:
no clock is read, one untaken branch per piece).

prof's slots: one per piece kind (KINDS: the calling thread's cycles in that piece), then one
per kind for the spans of its parallel regions (SPANS + kind: from the first thread's start of
work in a region to the last one's end), REGIONS (the parallel regions entered), SPAN (the spans
since the last lap), then a start and an end stamp per chunk of the region running. A piece's
time minus its spans is the cost of starting and joining its threads and its serial setup.
Cycles are the time-stamp counter's (constant rate on x86-64); bench converts them to seconds.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

KINDS = ("embed", "norms", "qkv", "rope", "attention", "o", "gate_up", "down", "head")
EMBED, NORMS, QKV, ROPE, ATTENTION, OUT, GATE_UP, DOWN, HEAD = range(len(KINDS))
SPANS = len(KINDS)  # SPANS + kind: the spans of that kind's parallel regions
REGIONS, SPAN = 2 * len(KINDS), 2 * len(KINDS) + 1
STAMPS = 2 * len(KINDS) + 2  # first chunk stamp slot
MAX_CHUNKS = 64  # chunks per region with stamps (later ones are not stamped)
SLOTS = STAMPS + 2 * MAX_CHUNKS


def new_prof() -> np.ndarray:
    return np.zeros(SLOTS, np.int64)


NO_PROF = np.zeros(0, np.int64)  # "do not profile"


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (rdtsc on x86-64)"""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
        return builder.call(fn, [])

    return sig, codegen


@njit(inline="always", cache=True)
def start(prof):
    """A stamp to lap from (0 when not profiling: no clock read)"""
    return cycles() if prof.shape[0] else np.int64(0)


@njit(inline="always", cache=True)
def lap(prof, kind, t0):
    """prof[kind] += the cycles since t0, and the spans of the regions since to kind's; -> now
    (t0 when not profiling)"""
    if prof.shape[0] == 0:
        return t0
    t = cycles()
    prof[kind] += t - t0
    prof[SPANS + kind] += prof[SPAN]
    prof[SPAN] = 0
    return t


@njit(inline="always", cache=True)
def chunk_start(prof, c):
    if prof.shape[0] and c < MAX_CHUNKS:
        prof[STAMPS + 2 * c] = cycles()


@njit(inline="always", cache=True)
def chunk_end(prof, c):
    if prof.shape[0] and c < MAX_CHUNKS:
        prof[STAMPS + 2 * c + 1] = cycles()


@njit(inline="always", cache=True)
def region_done(prof, chunks):
    """After a parallel region of `chunks` stamped chunks: count it, add its span"""
    if prof.shape[0] == 0:
        return
    n = min(chunks, MAX_CHUNKS)
    first, last = prof[STAMPS], prof[STAMPS + 1]
    for c in range(1, n):
        first = min(first, prof[STAMPS + 2 * c])
        last = max(last, prof[STAMPS + 2 * c + 1])
    prof[REGIONS] += 1
    prof[SPAN] += last - first
