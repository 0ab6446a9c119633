"""The int16 path's arithmetic as it first landed (repack, quantize, the one-token tile), frozen:
later tiles of `kolibri_cli.engine.int16` must give these bits for every (row, token), since the
path's measured fidelity and its batch invariance were established on them. Its own layout and
activation order; compared only through `reference_matmul`. Its primitives are its own frozen
copies (`simd8_before`), so a change to the kernel's primitives cannot move this oracle."""


import numpy as np
from numba import njit
from simd8_before import (
    fload,
    hload,
    vadd32,
    vcvt8,
    vfma8,
    vmadd16,
    vmul8,
    vpair,
    vround8_store,
    vsum8,
    vzero8,
    wload_i8,
    wload_u4,
    xload,
)

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

Q4_1W, Q8_0W = 113, 118  # kernel storage codes of the int16 layouts (no GGML type uses them)
GROUP = 8  # blocks per group


# ---------------------------------------------------------------- weights: repacked at load


def _pairs_q4_1(qs: np.ndarray) -> np.ndarray:
    """[..., 2, 16] code bytes of blocks (a, b) -> [..., 32]: a[0:8] b[0:8] a[8:16] b[8:16]"""
    return np.concatenate([qs[..., 0, :8], qs[..., 1, :8], qs[..., 0, 8:], qs[..., 1, 8:]],
                          axis=-1)


def _pairs_q8_0(qs: np.ndarray) -> np.ndarray:
    """[..., 2, 32] codes of blocks (a, b) -> [..., 64]: runs 0, 2, 1, 3 of 8, a then b"""
    runs = [qs[..., k, 8 * r:8 * r + 8] for r in (0, 2, 1, 3) for k in (0, 1)]
    return np.concatenate(runs, axis=-1)


def _group(d: np.ndarray, m: np.ndarray | None, qs: np.ndarray, pairs) -> np.ndarray:
    """One group of n blocks of every row: d, m [N, n] float16, qs [N, n, code bytes]
    -> [N, group bytes]"""
    n_rows, n = d.shape
    parts = [np.ascontiguousarray(d).view(np.uint8)]
    if m is not None:
        parts.append(np.ascontiguousarray(m).view(np.uint8))
    parts.append(pairs(qs.reshape(n_rows, n // 2, 2, -1)).reshape(n_rows, -1))
    return np.concatenate(parts, axis=1)


def repack(q4: bool, rows: np.ndarray) -> tuple[int, np.ndarray]:
    """The GGUF's rows [N, row bytes] of Q4_1 (q4) or Q8_0 blocks -> (int16-path code, rows
    [N, bytes]) in the layout above."""
    nbytes = 20 if q4 else 34
    blocks = rows.reshape(rows.shape[0], -1, nbytes)
    if blocks.shape[1] % 2:  # a zero block: scales 0, codes 0 (Q8_0) / 0 (Q4_1: d = m = 0)
        blocks = np.concatenate([blocks, np.zeros_like(blocks[:, :1])], axis=1)
    scales = blocks[:, :, :4 if q4 else 2].copy().view(np.float16)
    d, m = scales[:, :, 0], scales[:, :, 1] if q4 else None
    qs = blocks[:, :, 4 if q4 else 2:]
    pairs = _pairs_q4_1 if q4 else _pairs_q8_0
    groups = [_group(d[:, g:g + GROUP], None if m is None else m[:, g:g + GROUP],
                     qs[:, g:g + GROUP], pairs) for g in range(0, blocks.shape[1], GROUP)]
    return (Q4_1W if q4 else Q8_0W), np.ascontiguousarray(np.concatenate(groups, axis=1))


# ---------------------------------------------------------------- activations: one token at a time


SUB = 16  # activations per scale: runs of SUB // 8 of a block's 4 runs of 8 share one
GROUPS = 32 // SUB  # scales per block
_CHUNK = (0, 2, 1, 3)  # the chunk of 16 codes of its pair (chunk c at 16c) that run r goes in


@njit(inline="always", cache=True)
def _scale(amax):
    """(d, 1/d) for values up to amax: d = amax / 32767; (0, 0) when the inverse would
    overflow (activations that small quantize to zeros)"""
    d = amax / np.float32(32767.0)
    inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
    if not np.isfinite(inv):
        return np.float32(0.0), np.float32(0.0)
    return d, inv


@njit(inline="always", cache=True)
def _amax(x, e, n):
    """max |x[e : e+n]| (exact: max is exact in any order)"""
    m = np.float32(0.0)
    for i in range(e, e + n):
        m = max(m, abs(x[i]))
    return m


@njit(cache=True)
def _quantize_row(x, xq, xsp, xs):
    """One token: x [Kp] (Kp a multiple of 32) -> its rows of xq, xsp, xs"""
    for b in range(x.shape[0] // 32):
        pair, k = b >> 1, b & 1
        total = np.float32(0.0)
        for g in range(GROUPS):
            d, inv = _scale(_amax(x, 32 * b + SUB * g, SUB))
            codes = np.int32(0)
            for r in range(SUB // 8 * g, SUB // 8 * (g + 1)):
                codes += vround8_store(x, 32 * b + 8 * r, inv, xq,
                                       64 * pair + 16 * _CHUNK[r] + 8 * k)
            for lane in range(4):
                xsp[8 * (GROUPS * pair + g) + 4 * k + lane] = d
            total += d * np.float32(codes)
        xs[b] = total


@njit(cache=True)
def quantize(x):
    """x [L, Kp] float32 (Kp a multiple of 32) -> (xq int16 [L, P*64], xsp float32
    [L, P*GROUPS*8], xs float32 [L, G*8], blocks per row), each token alone (P pairs of blocks,
    G groups: zeros after Kp)"""
    n, k = x.shape
    nb = k // 32
    n_pairs = -(-nb // 2)
    n_groups = -(-nb // GROUP)
    xq = np.zeros((n, n_pairs * 64), np.int16)
    xsp = np.zeros((n, n_pairs * GROUPS * 8), np.float32)
    xs = np.zeros((n, n_groups * GROUP), np.float32)
    for t in range(n):
        _quantize_row(x[t], xq[t], xsp[t], xs[t])
    return xq, xsp, xs, 2 * n_pairs


# ---------------------------------------------------------------- one pair of blocks
# A row's group at byte o (n blocks): d at o, Q4_1's m at o + 2n, pair p's codes at
# o + 2n (Q8_0) or o + 4n (Q4_1), 32 or 64 bytes each.


@njit(inline="always", cache=True)
def _weights(d, o, q4):
    """The 64 weights of a pair at byte o, as four 16 x int16 in the activations' order"""
    if q4:
        a_lo, a_hi = wload_u4(d, o)
        b_lo, b_hi = wload_u4(d, o + 16)
        return a_lo, a_hi, b_lo, b_hi
    return wload_i8(d, o), wload_i8(d, o + 16), wload_i8(d, o + 32), wload_i8(d, o + 48)


@njit(inline="always", cache=True)
def _madd(w, xq, e, c):
    """Chunk c's integer dot: lanes 0..3 block a, 4..7 block b   (the pair's codes at e)"""
    return vmadd16(w[c], xload(xq, e + 16 * c))


@njit(inline="always", cache=True)
def _pair(w, dw, p, x, t, pair, acc):
    """acc after pair `pair` (p-th of its group) of token t: each scale group's integer dot,
    scaled by the weights' and its activations' scales   x = quantize's tuple"""
    xq, xsp = x[0], x[1]
    e, f = t * xq.shape[1] + 64 * pair, t * xsp.shape[1] + 8 * GROUPS * pair
    dwp = vpair(dw, p)
    if GROUPS == 1:
        i = vadd32(vadd32(_madd(w, xq, e, 0), _madd(w, xq, e, 1)),
                   vadd32(_madd(w, xq, e, 2), _madd(w, xq, e, 3)))
        return vfma8(vcvt8(i), vmul8(dwp, fload(xsp, f)), acc)
    if GROUPS == 2:  # runs 0, 1 are chunks 0, 2; runs 2, 3 chunks 1, 3
        i = vadd32(_madd(w, xq, e, 0), _madd(w, xq, e, 2))
        acc = vfma8(vcvt8(i), vmul8(dwp, fload(xsp, f)), acc)
        i = vadd32(_madd(w, xq, e, 1), _madd(w, xq, e, 3))
        return vfma8(vcvt8(i), vmul8(dwp, fload(xsp, f + 8)), acc)
    for r in range(4):
        acc = vfma8(vcvt8(_madd(w, xq, e, _CHUNK[r])), vmul8(dwp, fload(xsp, f + 8 * r)), acc)
    return acc


@njit(inline="always", cache=True)
def _minimums(d, o, n, q4, x, t, g, acc):
    """Q4_1: acc after the group's m * s_x lanes (Q8_0: acc)"""
    if not q4:
        return acc
    xs = x[2]
    return vfma8(hload(d, o + 2 * n, n), fload(xs, t * xs.shape[1] + GROUP * g), acc)


# ---------------------------------------------------------------- tiles


@njit(inline="always", cache=True)
def _group_geometry(nb, g, q4):
    """(blocks n, byte offset, codes offset within the group) of group g of a row"""
    n = min(GROUP, nb - GROUP * g)
    per = 20 if q4 else 34
    return n, GROUP * per * g, (4 if q4 else 2) * n


@njit(cache=True)
def _rows4(d, o0, o1, o2, o3, q4, x, t):
    """(row at o_i . token t for i < 4): one token, the activations loaded once for 4 rows"""
    nb, pb = x[3], 32 if q4 else 64
    a0 = a1 = a2 = a3 = vzero8()
    for g in range(-(-nb // GROUP)):
        n, go, co = _group_geometry(nb, g, q4)
        a0 = _minimums(d, o0 + go, n, q4, x, t, g, a0)
        a1 = _minimums(d, o1 + go, n, q4, x, t, g, a1)
        a2 = _minimums(d, o2 + go, n, q4, x, t, g, a2)
        a3 = _minimums(d, o3 + go, n, q4, x, t, g, a3)
        d0, d1 = hload(d, o0 + go, n), hload(d, o1 + go, n)
        d2, d3 = hload(d, o2 + go, n), hload(d, o3 + go, n)
        for p in range(n // 2):
            pair, c = GROUP // 2 * g + p, go + co + pb * p
            a0 = _pair(_weights(d, o0 + c, q4), d0, p, x, t, pair, a0)
            a1 = _pair(_weights(d, o1 + c, q4), d1, p, x, t, pair, a1)
            a2 = _pair(_weights(d, o2 + c, q4), d2, p, x, t, pair, a2)
            a3 = _pair(_weights(d, o3 + c, q4), d3, p, x, t, pair, a3)
    return vsum8(a0), vsum8(a1), vsum8(a2), vsum8(a3)


@njit(inline="always", cache=True)
def unit_offsets(unit):
    """The unit's 4 row offsets (its n rows, the last repeated; extra results discarded)"""
    n, o, stride = unit[1], unit[3], unit[4]
    return (o, o + min(1, n - 1) * stride, o + min(2, n - 1) * stride,
            o + min(3, n - 1) * stride)


@njit(cache=True)
def units_one_token(d, units, u0, u1, x, t, out):
    """out[t, r] = row r . token t for the rows of units u0..u1-1"""
    for u in range(u0, u1):
        r0, n = units[u, 0], units[u, 1]
        o0, o1, o2, o3 = unit_offsets(units[u])
        s = _rows4(d, o0, o1, o2, o3, units[u, 2] == Q4_1W, x, t)
        out[t, r0] = s[0]
        if n > 1:
            out[t, r0 + 1] = s[1]
        if n > 2:
            out[t, r0 + 2] = s[2]
        if n > 3:
            out[t, r0 + 3] = s[3]


def reference_matmul(q4: bool, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The GGUF's rows [N, row bytes] of Q4_1 (q4) or Q8_0 blocks . x [L, Kp] -> [L, N], each
    (row, token) by the first tiles: one token by the 4-row tile, each token alone"""
    code, data = repack(q4, rows)
    n, step = data.shape
    units = np.array([[r, min(4, n - r), code, r * step, step] for r in range(0, n, 4)], np.int64)
    out = np.zeros((x.shape[0], n), np.float32)
    xs = quantize(np.ascontiguousarray(x, np.float32))
    for t in range(x.shape[0]):
        units_one_token(data.reshape(-1), units, 0, units.shape[0], xs, t, out)
    return out
