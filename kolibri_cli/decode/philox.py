"""Philox4x32-10, the counter-based generator of Random123 (Salmon et al., SC'11): 32-bit words
that are a pure function of (key, counter), so any word can be computed without the others.

kolibri keys it by the sampling seed and puts the absolute position in the counter: the noise of
token i at position t is word i % 4 of philox(key=seed, counter=(i // 4, t_lo, t_hi, 0)).
Checked against Random123's published known-answer vectors (tests/test_sampling.py).
"""

import numpy as np
from numba import njit

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

_M0 = np.uint64(0xD2511F53)  # Random123's multipliers and Weyl key increments
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@njit(cache=True)
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Ten rounds over the counter (c0..c3) with key (k0, k1); uint64 values holding 32 bits."""
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (p1 >> _S32) ^ c1 ^ k0, p1 & _LO, (p0 >> _S32) ^ c3 ^ k1, p0 & _LO
        k0 = (k0 + _W0) & _LO
        k1 = (k1 + _W1) & _LO
    return c0, c1, c2, c3


@njit(cache=True)
def block(j, pos, seed):
    """The four words of block j (tokens 4j..4j+3) at position `pos` for `seed`."""
    s, p = np.uint64(seed), np.uint64(pos)
    return philox4x32(np.uint64(j), p & _LO, p >> _S32, np.uint64(0), s & _LO, s >> _S32)


@njit(cache=True)
def words(seed, pos, n):
    """[n] uint32: the word of every token 0..n-1 at position `pos`."""
    out = np.empty(4 * ((n + 3) // 4), np.uint32)
    for j in range(out.shape[0] // 4):
        out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3] = block(j, pos, seed)
    return out[:n]
