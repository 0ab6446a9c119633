"""The int16 numeric path: the weights' own Q4_1/Q8_0 codes times activations quantized to int16
per SUB (16) values, summed as exact integers (AVX2 `vpmaddwd`), each block's affine
dequantization applied once per integer sum.

Not bit-identical to the float32 path (an activation is rounded to 1/65534 of its run's largest
magnitude, 256 times finer than the int8 path), so its fidelity is measured, not assumed
(docs/bench.md). It is batch-invariant by construction: each token's activations are quantized
alone, integer sums are exact, and every (row, token) result is finished by the same float
operations in one fixed order, whatever L is or which tile computes it. Without AVX2 (another
CPU, KOLIBRI_SIMD=portable) `simd8` computes the same integers in portable code: the same bits.

Layout (repacked at load, the GGUF's bytes per block: float16 scales, no padding for an even
number of blocks). A row's blocks form groups of 8 (the last of 2, 4 or 6; an odd count gets a
zero block): per group the n float16 scales d, for Q4_1 the n float16 minimums m, then the
codes in pairs of blocks (a, b): Q4_1 16 words (a[i], a[8+i]) for i < 8, then (b[i], b[8+i]),
of the 16 code bytes (the low nibbles are weights 0..15, the high ones 16..31), so a word's four
nibbles are weights i, 16+i, 8+i, 24+i; Q8_0 the 32 codes in runs of 8 as
`a[0:8] b[0:8] a[16:24] b[16:24] a[8:16] b[8:16] a[24:32] b[24:32]`. A token's activations are
stored per pair in the order the weights unpack (runs 0, 2, 1, 3 of 8 values: a's then b's), so
one `vpmaddwd` of 16 weights and 16 codes gives int32 lanes 0..3 of block a and 4..7 of block b.
Its activation scales are stored per group, pair p's blocks in lanes p and 4 + p.

Per group of a row, token by token:
    Q4_1: acc = fma(m[8], s_x[8], acc)              s_x = sum over the block of d_x * codes
    then per pair p and run of SUB values g: acc = fma(float(isum), spread(d * d_x, p), acc)
(the products d * d_x of the group's 8 blocks in one multiply, their lanes dealt as above;
spread(v, p) = pair p's first block's in lanes 0..3, its second's in 4..7), then the fixed tree
of 8 lanes. Tiles share loads (a token's codes over 4 rows, a pair's weights over 4 tokens),
never an operation: every tile gives these bits. Each row's stream prefetches AHEAD bytes in
front of its reads (a hint: no result depends on it).
"""

import numpy as np
from numba import njit

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))
from kolibri_cli.engine.int8 import unit_offsets
from kolibri_cli.engine.simd8 import (
    fload,
    hload,
    prefetch,
    vadd32,
    vcvt8,
    vdeal8,
    vfma8,
    vmadd16,
    vmul8,
    vround8_store,
    vspread,
    vsum8,
    vzero8,
    wload_i8,
    wload_u4w,
    xload,
)

Q4_1W, Q8_0W = 113, 118  # kernel storage codes of the int16 layouts (no GGML type uses them)
GROUP = 8  # blocks per group
AHEAD = 4096  # bytes: each row's stream asks for its lines this far ahead of its reads (the
# hardware prefetcher alone left a 1-token forward's matmuls waiting on memory: docs/bench.md,
# "The int16 path"; see `_ahead`)


# ---------------------------------------------------------------- weights: repacked at load


def _pairs_q4_1(qs: np.ndarray) -> np.ndarray:
    """[..., 2, 16] code bytes of blocks (a, b) -> [..., 32]: 16 words (a[i], a[8+i]) for i < 8,
    then (b[i], b[8+i])"""
    return np.stack([qs[..., :8], qs[..., 8:]], axis=-1).reshape(*qs.shape[:-2], 32)


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


SUB = 16  # activations per scale: runs of SUB // 8 of a block's 4 runs of 8 share one (the
# tiles assume 16: two scales per block)
GROUPS = 32 // SUB  # scales per block
assert GROUPS == 2, "the tiles read two activation scales per block (_scales, _pair)"
_CHUNK = (0, 2, 1, 3)  # the chunk of 16 codes of its pair (chunk c at 16c) that run r goes in


@njit(forceinline=True, cache=True)
def _scale(amax):
    """(d, 1/d) for values up to amax: d = amax / 32767; (0, 0) when the inverse would
    overflow (activations that small quantize to zeros)"""
    d = amax / np.float32(32767.0)
    inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
    if not np.isfinite(inv):
        return np.float32(0.0), np.float32(0.0)
    return d, inv


@njit(forceinline=True, cache=True)
def _amax(x, e, n):
    """max |x[e : e+n]| (exact: max is exact in any order)"""
    m = np.float32(0.0)
    for i in range(e, e + n):
        m = max(m, abs(x[i]))
    return m


@njit(cache=True)
def _quantize_row(x, xq, xsg, xs):
    """One token: x [Kp] (Kp a multiple of 32) -> its rows of xq, xsg, xs"""
    for b in range(x.shape[0] // 32):
        pair, k = b >> 1, b & 1
        lane = 8 * GROUPS * (b // GROUP) + 4 * k + (b % GROUP >> 1)  # pair p's block k: 4k + p
        total = np.float32(0.0)
        for g in range(GROUPS):
            d, inv = _scale(_amax(x, 32 * b + SUB * g, SUB))
            codes = np.int32(0)
            for r in range(SUB // 8 * g, SUB // 8 * (g + 1)):
                codes += vround8_store(x, 32 * b + 8 * r, inv, xq,
                                       64 * pair + 16 * _CHUNK[r] + 8 * k)
            xsg[lane + 8 * g] = d
            total += d * np.float32(codes)
        xs[b] = total


@njit(cache=True)
def quantize(x):
    """x [L, Kp] float32 (Kp a multiple of 32) -> (xq int16 [L, P*64], xsg float32
    [L, G*GROUPS*8], xs float32 [L, G*8], blocks per row), each token alone (P pairs of blocks,
    G groups: zeros after Kp)"""
    n, k = x.shape
    nb = k // 32
    n_pairs = -(-nb // 2)
    n_groups = -(-nb // GROUP)
    xq = np.zeros((n, n_pairs * 64), np.int16)
    xsg = np.zeros((n, n_groups * GROUPS * 8), np.float32)
    xs = np.zeros((n, n_groups * GROUP), np.float32)
    for t in range(n):
        _quantize_row(x[t], xq[t], xsg[t], xs[t])
    return xq, xsg, xs, 2 * n_pairs


# ---------------------------------------------------------------- one pair of blocks
# A row's group at byte o (n blocks): d at o, Q4_1's m at o + 2n, pair p's codes at
# o + 2n (Q8_0) or o + 4n (Q4_1), 32 or 64 bytes each. Each function is specialized on q4 (a
# constant where the unit loops call the tiles).
# The helpers are `forceinline` (numba compiles each once per signature, LLVM inlines the code),
# not numba's `inline="always"`, which copies and re-types a helper's IR at every call site of
# the unrolled tiles: ~22 s of numba per entry point, ~46 s of the int16 kernel's first compile.


@njit(forceinline=True, cache=True)
def _weights(d, o, q4):
    """The 64 weights of a pair at byte o, as four 16 x int16 chunks in the activations' order"""
    if q4:
        return wload_u4w(d, o)
    return wload_i8(d, o), wload_i8(d, o + 16), wload_i8(d, o + 32), wload_i8(d, o + 48)


@njit(forceinline=True, cache=True)
def _scales(dw, x, t, g):
    """Group g's scale products of token t, one per run of SUB values: (weight scales dw of the
    group, `vdeal8`-ordered) * (activation scales) -> pair p's in lanes p and 4 + p"""
    xsg = x[1]
    f = t * xsg.shape[1] + 8 * GROUPS * g
    return vmul8(dw, fload(xsg, f)), vmul8(dw, fload(xsg, f + 8))


@njit(forceinline=True, cache=True)
def _pair(w, s, p, xq, e, acc):
    """acc after pair p (a constant) of a group, its codes at flat element e of xq: each run of
    SUB values' integer dot (runs 0, 1 are chunks 0, 2; runs 2, 3 chunks 1, 3) times its
    scale product, spread over the pair's lanes"""
    i = vadd32(vmadd16(w[0], xload(xq, e)), vmadd16(w[2], xload(xq, e + 32)))
    acc = vfma8(vcvt8(i), vspread(s[0], p), acc)
    i = vadd32(vmadd16(w[1], xload(xq, e + 16)), vmadd16(w[3], xload(xq, e + 48)))
    return vfma8(vcvt8(i), vspread(s[1], p), acc)


@njit(forceinline=True, cache=True)
def _minimums(d, o, n, q4, x, t, g, acc):
    """Q4_1: acc after the group's m * s_x lanes (Q8_0: acc)"""
    if not q4:
        return acc
    xs = x[2]
    return vfma8(hload(d, o + 2 * n, n), fload(xs, t * xs.shape[1] + GROUP * g), acc)


# ---------------------------------------------------------------- tiles


@njit(forceinline=True, cache=True)
def _group_geometry(nb, g, q4):
    """(blocks n, byte offset, codes offset within the group) of group g of a row"""
    n = min(GROUP, nb - GROUP * g)
    per = 20 if q4 else 34
    return n, GROUP * per * g, (4 if q4 else 2) * n


@njit(forceinline=True, cache=True)
def _rows_pair(d, o, c, q4, s, p, xq, e, a):
    """4 rows' accumulators a after pair p (codes at byte c of each group at o) of one token"""
    return (_pair(_weights(d, o[0] + c, q4), s[0], p, xq, e, a[0]),
            _pair(_weights(d, o[1] + c, q4), s[1], p, xq, e, a[1]),
            _pair(_weights(d, o[2] + c, q4), s[2], p, xq, e, a[2]),
            _pair(_weights(d, o[3] + c, q4), s[3], p, xq, e, a[3]))


@njit(forceinline=True, cache=True)
def _ahead(d, o, q4):
    """Prefetch the lines AHEAD bytes past a group at byte o of a row (160 bytes for Q4_1,
    272 for Q8_0): a hint, so neither the results nor the order of any sum change"""
    for k in range(0, 192 if q4 else 320, 64):
        prefetch(d, o + AHEAD + k)


@njit(forceinline=True, cache=True)
def _rows4(d, o, q4, x, t):
    """(row at o[i] . token t for i < 4): one token, its activations loaded once for 4 rows"""
    nb, pb, xq = x[3], 32 if q4 else 64, x[0]
    a = (vzero8(), vzero8(), vzero8(), vzero8())
    for g in range(-(-nb // GROUP)):
        n, go, co = _group_geometry(nb, g, q4)
        og = (o[0] + go, o[1] + go, o[2] + go, o[3] + go)
        _ahead(d, og[0], q4), _ahead(d, og[1], q4), _ahead(d, og[2], q4), _ahead(d, og[3], q4)
        a = (_minimums(d, og[0], n, q4, x, t, g, a[0]), _minimums(d, og[1], n, q4, x, t, g, a[1]),
             _minimums(d, og[2], n, q4, x, t, g, a[2]), _minimums(d, og[3], n, q4, x, t, g, a[3]))
        s = (_scales(vdeal8(hload(d, og[0], n)), x, t, g),
             _scales(vdeal8(hload(d, og[1], n)), x, t, g),
             _scales(vdeal8(hload(d, og[2], n)), x, t, g),
             _scales(vdeal8(hload(d, og[3], n)), x, t, g))
        c, e = go + co, t * xq.shape[1] + 64 * (GROUP // 2) * g
        a = _rows_pair(d, o, c, q4, s, 0, xq, e, a)
        if n > 2:
            a = _rows_pair(d, o, c + pb, q4, s, 1, xq, e + 64, a)
        if n > 4:
            a = _rows_pair(d, o, c + 2 * pb, q4, s, 2, xq, e + 128, a)
        if n > 6:
            a = _rows_pair(d, o, c + 3 * pb, q4, s, 3, xq, e + 192, a)
    return vsum8(a[0]), vsum8(a[1]), vsum8(a[2]), vsum8(a[3])


@njit(forceinline=True, cache=True)
def _tokens_pair(w, s, p, xq, e, a):
    """4 tokens' accumulators a after pair p, its weights w unpacked once; e, s per token"""
    return (_pair(w, s[0], p, xq, e[0], a[0]), _pair(w, s[1], p, xq, e[1], a[1]),
            _pair(w, s[2], p, xq, e[2], a[2]), _pair(w, s[3], p, xq, e[3], a[3]))


@njit(forceinline=True, cache=True)
def _tokens4(d, o, q4, x, t):
    """(row at o . token t[j] for j < 4): each pair's weights unpacked once for 4 tokens"""
    nb, pb, xq = x[3], 32 if q4 else 64, x[0]
    a = (vzero8(), vzero8(), vzero8(), vzero8())
    for g in range(-(-nb // GROUP)):
        n, go, co = _group_geometry(nb, g, q4)
        _ahead(d, o + go, q4)
        a = (_minimums(d, o + go, n, q4, x, t[0], g, a[0]),
             _minimums(d, o + go, n, q4, x, t[1], g, a[1]),
             _minimums(d, o + go, n, q4, x, t[2], g, a[2]),
             _minimums(d, o + go, n, q4, x, t[3], g, a[3]))
        dw = vdeal8(hload(d, o + go, n))
        s = (_scales(dw, x, t[0], g), _scales(dw, x, t[1], g), _scales(dw, x, t[2], g),
             _scales(dw, x, t[3], g))
        c, e0 = o + go + co, 64 * (GROUP // 2) * g
        e = (t[0] * xq.shape[1] + e0, t[1] * xq.shape[1] + e0, t[2] * xq.shape[1] + e0,
             t[3] * xq.shape[1] + e0)
        a = _tokens_pair(_weights(d, c, q4), s, 0, xq, e, a)
        if n > 2:
            e = (e[0] + 64, e[1] + 64, e[2] + 64, e[3] + 64)
            a = _tokens_pair(_weights(d, c + pb, q4), s, 1, xq, e, a)
        if n > 4:
            e = (e[0] + 64, e[1] + 64, e[2] + 64, e[3] + 64)
            a = _tokens_pair(_weights(d, c + 2 * pb, q4), s, 2, xq, e, a)
        if n > 6:
            e = (e[0] + 64, e[1] + 64, e[2] + 64, e[3] + 64)
            a = _tokens_pair(_weights(d, c + 3 * pb, q4), s, 3, xq, e, a)
    return vsum8(a[0]), vsum8(a[1]), vsum8(a[2]), vsum8(a[3])


@njit(forceinline=True, cache=True)
def _units_one_token(d, units, u0, u1, q4, x, t, out):
    for u in range(u0, u1):
        r0, n = units[u, 0], units[u, 1]
        s = _rows4(d, unit_offsets(units[u]), q4, x, t)
        out[t, r0] = s[0]
        if n > 1:
            out[t, r0 + 1] = s[1]
        if n > 2:
            out[t, r0 + 2] = s[2]
        if n > 3:
            out[t, r0 + 3] = s[3]


@njit(cache=True)
def units_one_token(d, units, u0, u1, x, t, out):
    """out[t, r] = row r . token t for the rows of units u0..u1-1 (all of one block type)"""
    if units[u0, 2] == Q4_1W:
        _units_one_token(d, units, u0, u1, True, x, t, out)
    else:
        _units_one_token(d, units, u0, u1, False, x, t, out)


@njit(forceinline=True, cache=True)
def _units_tokens(d, units, u0, u1, q4, x, t0, t4, out):
    for u in range(u0, u1):
        r0, n = units[u, 0], units[u, 1]
        offs = unit_offsets(units[u])
        for i in range(n):
            for j in range(t0, t4, 4):
                s = _tokens4(d, offs[i], q4, x, (j, j + 1, j + 2, j + 3))
                for q in range(4):
                    out[j + q, r0 + i] = s[q]


@njit(cache=True)
def units_tokens(d, units, u0, u1, x, t0, t1, out):
    """out[t, r] = row r . token t for the rows of units u0..u1-1 (all of one block type),
    t0 <= t < t1, in tiles of one row x 4 tokens; the last (t1 - t0) % 4 tokens each in the 4-row
    tile of one token (cheaper than a 4-token tile that repeats them)"""
    t4 = t0 + (t1 - t0) // 4 * 4
    if units[u0, 2] == Q4_1W:
        _units_tokens(d, units, u0, u1, True, x, t0, t4, out)
    else:
        _units_tokens(d, units, u0, u1, False, x, t0, t4, out)
    for t in range(t4, t1):
        units_one_token(d, units, u0, u1, x, t, out)
