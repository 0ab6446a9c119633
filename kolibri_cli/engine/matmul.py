"""Batch-invariant matmul tiles: out = x @ w.T with every (row, token) dot product summed in one
fixed order, whatever the number of tokens L in the call.

A unit of work is R weight rows r0 + i*step (i < R) for all L tokens. Striding the rows by
step = N // R gives each thread R long sequential streams that the hardware prefetcher keeps
ahead of; the tokens go through in register tiles of 3 (then 2 or 1), the unit's rows staying
in L1/L2 between tiles, so an L-token matmul reads the weights from memory once.
"""

import numpy as np
from numba import njit, prange

from kolibri_cli.engine.jit import ONE, REDUCE, ZERO

# R and R1 ARE the accumulator counts of the tiles below (s0..s7 and s0..s3): the unit math uses
# them, the tiles write exactly that many rows. Change both together (test_kernel checks that
# every output element is written).
R = 8  # weight rows per unit of parallel work
R1 = 4  # ... when L == 1: fewer streams per thread, measured ~10% faster decode


@njit(fastmath=REDUCE, cache=True)
def _tile1(x, j, w, r0, step, out):
    """out[j, r0 + i*step] = x[j] . w[r0 + i*step] for i < R   x [L, K], w [N, K], out [L, N]"""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO
    for k in range(x.shape[1]):
        a = x[j, k]
        s0 += w[r0, k] * a
        s1 += w[r0 + step, k] * a
        s2 += w[r0 + 2 * step, k] * a
        s3 += w[r0 + 3 * step, k] * a
        s4 += w[r0 + 4 * step, k] * a
        s5 += w[r0 + 5 * step, k] * a
        s6 += w[r0 + 6 * step, k] * a
        s7 += w[r0 + 7 * step, k] * a
    for i, s in enumerate((s0, s1, s2, s3, s4, s5, s6, s7)):
        out[j, r0 + i * step] = s


@njit(fastmath=REDUCE, cache=True)
def _tile1_r1(x, w, r0, step, out):
    """_tile1 for token 0 and R1 = 4 rows (the decode path)"""
    s0 = s1 = s2 = s3 = ZERO
    for k in range(x.shape[1]):
        a = x[0, k]
        s0 += w[r0, k] * a
        s1 += w[r0 + step, k] * a
        s2 += w[r0 + 2 * step, k] * a
        s3 += w[r0 + 3 * step, k] * a
    for i, s in enumerate((s0, s1, s2, s3)):
        out[0, r0 + i * step] = s


@njit(fastmath=REDUCE, cache=True)
def _tile2(x, j, w, r0, step, out):
    """_tile1 for tokens j, j+1"""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO  # token j
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = ZERO  # token j+1
    for k in range(x.shape[1]):
        a, b = x[j, k], x[j + 1, k]
        v = w[r0, k]
        s0 += v * a
        t0 += v * b
        v = w[r0 + step, k]
        s1 += v * a
        t1 += v * b
        v = w[r0 + 2 * step, k]
        s2 += v * a
        t2 += v * b
        v = w[r0 + 3 * step, k]
        s3 += v * a
        t3 += v * b
        v = w[r0 + 4 * step, k]
        s4 += v * a
        t4 += v * b
        v = w[r0 + 5 * step, k]
        s5 += v * a
        t5 += v * b
        v = w[r0 + 6 * step, k]
        s6 += v * a
        t6 += v * b
        v = w[r0 + 7 * step, k]
        s7 += v * a
        t7 += v * b
    for i, (s, t) in enumerate(((s0, t0), (s1, t1), (s2, t2), (s3, t3), (s4, t4), (s5, t5),
                                (s6, t6), (s7, t7))):
        out[j, r0 + i * step], out[j + 1, r0 + i * step] = s, t


@njit(fastmath=REDUCE, cache=True)
def _tile3(x, j, w, r0, step, out):
    """_tile1 for tokens j, j+1, j+2"""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO  # token j
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = ZERO  # token j+1
    u0 = u1 = u2 = u3 = u4 = u5 = u6 = u7 = ZERO  # token j+2
    for k in range(x.shape[1]):
        a, b, c = x[j, k], x[j + 1, k], x[j + 2, k]
        v = w[r0, k]
        s0, t0, u0 = s0 + v * a, t0 + v * b, u0 + v * c
        v = w[r0 + step, k]
        s1, t1, u1 = s1 + v * a, t1 + v * b, u1 + v * c
        v = w[r0 + 2 * step, k]
        s2, t2, u2 = s2 + v * a, t2 + v * b, u2 + v * c
        v = w[r0 + 3 * step, k]
        s3, t3, u3 = s3 + v * a, t3 + v * b, u3 + v * c
        v = w[r0 + 4 * step, k]
        s4, t4, u4 = s4 + v * a, t4 + v * b, u4 + v * c
        v = w[r0 + 5 * step, k]
        s5, t5, u5 = s5 + v * a, t5 + v * b, u5 + v * c
        v = w[r0 + 6 * step, k]
        s6, t6, u6 = s6 + v * a, t6 + v * b, u6 + v * c
        v = w[r0 + 7 * step, k]
        s7, t7, u7 = s7 + v * a, t7 + v * b, u7 + v * c
    for i, (s, t, u) in enumerate(((s0, t0, u0), (s1, t1, u1), (s2, t2, u2), (s3, t3, u3),
                                   (s4, t4, u4), (s5, t5, u5), (s6, t6, u6), (s7, t7, u7))):
        out[j, r0 + i * step], out[j + 1, r0 + i * step], out[j + 2, r0 + i * step] = s, t, u


@njit(fastmath=REDUCE, cache=True)
def _row(x, w, r, out):
    """out[:, r] = x @ w[r]   (the N % R rows left over; always the same rows for a shape)"""
    for j in range(x.shape[0]):
        s = ZERO
        for k in range(x.shape[1]):
            s += w[r, k] * x[j, k]
        out[j, r] = s


@njit(cache=True)
def _unit_rows(n_rows, rows, b):
    """Unit b of an n_rows matrix cut in units of `rows` -> (first row, step, count):
    `rows` strided rows, or one leftover row."""
    n_blocks = n_rows // rows
    u = np.int64(b)  # prange indices may be unsigned; unsigned + signed would give float64
    if u < n_blocks:
        return u, n_blocks, rows
    return rows * n_blocks + u - n_blocks, 1, 1


@njit(cache=True)
def _n_units(n_rows, rows):
    return n_rows // rows + n_rows % rows


@njit(cache=True)
def _unit_size(x):
    """Rows per unit for x [L, K]: R1 for decode, R when tokens share the weight rows"""
    return R1 if x.shape[0] == 1 else R


@njit(cache=True)
def _unit(x, w, n_rows, offset, b, out):
    """out[:, rows] = x @ w[rows].T for the rows of unit b of w[offset:offset+n_rows]"""
    r0, step, count = _unit_rows(n_rows, _unit_size(x), b)
    if count == 1:
        _row(x, w, offset + r0, out)
        return
    if count == R1:
        _tile1_r1(x, w, offset + r0, step, out)
        return
    j = 0
    while j + 3 <= x.shape[0]:
        _tile3(x, j, w, offset + r0, step, out)
        j += 3
    if x.shape[0] - j == 2:
        _tile2(x, j, w, offset + r0, step, out)
    elif x.shape[0] - j == 1:
        _tile1(x, j, w, offset + r0, step, out)


@njit(parallel=True, cache=True)
def matmul(x, w, out):
    """out = x @ w.T   x [L, K], w [N, K] -> out [L, N]"""
    for b in prange(_n_units(w.shape[0], _unit_size(x))):
        _unit(x, w, w.shape[0], 0, b, out)


@njit(parallel=True, cache=True)
def matmul_add(x, w, tmp, h):
    """h += x @ w.T (the residual add fused in)   x [L, K], w [D, K], tmp/h [L, D]"""
    n_rows = w.shape[0]
    for b in prange(_n_units(n_rows, _unit_size(x))):
        _unit(x, w, n_rows, 0, b, tmp)
        r0, step, count = _unit_rows(n_rows, _unit_size(x), b)
        for j in range(x.shape[0]):
            for r in range(r0, r0 + count * step, step):
                h[j, r] += tmp[j, r]


@njit(cache=True)
def _silu(g):
    return g / (ONE + np.exp(-g))


@njit(parallel=True, cache=True)
def gate_up_silu(x, w, gu, act):
    """act = silu(x @ gate.T) * (x @ up.T)
    x [L, D], w [2F, D] rows gate then up, gu [L, 2F] scratch -> act [L, F]"""
    n_ff = act.shape[1]
    for b in prange(_n_units(n_ff, _unit_size(x))):
        _unit(x, w, n_ff, 0, b, gu)
        _unit(x, w, n_ff, n_ff, b, gu)
        r0, step, count = _unit_rows(n_ff, _unit_size(x), b)
        for j in range(x.shape[0]):
            for r in range(r0, r0 + count * step, step):
                act[j, r] = _silu(gu[j, r]) * gu[j, n_ff + r]

