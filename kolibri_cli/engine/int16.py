"""The int16 numeric path: the weights' own Q4_1/Q8_0 codes times activations quantized to int16
per SUB (16) values, summed as integers (AVX2 `vpmaddwd`), each block's affine dequantization
applied once per SUB-run's integer sum.

Not bit-identical to the float32 path (an activation is rounded to 1/65534 of its run's largest
magnitude, 256 times finer than the int8 path), so its fidelity is measured, not assumed
(docs/bench.md). It is batch-invariant by construction: each token's activations are quantized
alone, integer sums are exact, and every (row, token) result is finished by the same float
operations in one fixed order, whatever L is or which tile computes it. Without AVX2 (another
CPU, KOLIBRI_SIMD=portable) `simd8` computes the same integers in portable code: the same bits.

Layout (repacked at load, the GGUF's bytes per block: float16 scales, no padding for an even
number of blocks). A row's blocks form groups of n = 8 blocks, the last ones of 4 and 2 (an odd
count gets a zero block): per group the n float16 scales d, for Q4_1 the n float16 minimums m,
then the codes as 2n chunks of 16 (chunks 0..n-1 hold values 0..15 of every block, chunks
n..2n-1 values 16..31): int32 lane i of a chunk (its int16 lanes 2i, 2i+1) belongs to block
i*n/8, so one `vpmaddwd` of a chunk of weights and of activations adds to each lane the
products of ONE block and one SUB-run. Q8_0 stores a chunk as its 16 bytes; Q4_1 four chunks in
16 words, chunk k of them in nibble k of each word. A token's activations are stored alike
(`LAYOUT`: the value of the group each of its 32n slots holds), and its scales per group and
SUB-run spread over the lanes: lane i holds block i*n/8's.

Per group of a row, token by token:
    Q4_1: acc = fma(m[8], s_x[8], acc)              s_x = sum over the block of d_x * codes
    then per run s of SUB values: acc = fma(float(isum_s), spread(d) * d_x[s], acc)
(isum_s: the integer sum of the group's n chunks of run s, lane by lane; lanes n..7 of m and
s_x are zeros), then the fixed tree of 8 lanes. A lane's integer sum covers 16 products: exact
in int32, and converted exactly to float32 below 2^24 (Q4_1 always; Q8_0 codes near the int8
limit can round there, alike in every tile). Tiles share loads (a token's codes over 4 rows, a
group's weights over 4 tokens), never an operation: every tile gives these bits. Each row's
stream prefetches AHEAD bytes in front of its reads (a hint: no result depends on it).
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
    vfma8,
    vmadd16,
    vmul8,
    vround8_store,
    vspreadn,
    vsum8,
    vzero8,
    wload_i8,
    wload_u4w,
    xload,
)

Q4_1W, Q8_0W = 113, 118  # kernel storage codes of the int16 layouts (no GGML type uses them)
GROUP = 8  # blocks per group (a row's last groups: 4 and 2)
AHEAD = 4096  # bytes: each row's stream asks for its lines this far ahead of its reads (the
# hardware prefetcher alone left a 1-token forward's matmuls waiting on memory: docs/bench.md,
# "The int16 path"; see `_ahead`)
SUB = 16  # activations per scale: each block's values 0..15 share one, 16..31 another
RUNS = 32 // SUB  # scales per block
assert RUNS == 2, "the group layout holds two runs of 16 values per block"


def group_sizes(nb: int) -> list[int]:
    """The blocks of each group of a row of nb (even) blocks: 8s, then a 4 and a 2 if left"""
    sizes = [GROUP] * (nb // GROUP)
    for n in (4, 2):
        if nb % (2 * n) >= n:
            sizes.append(n)
    return sizes


def _layout(n: int) -> np.ndarray:
    """Slot -> value of a group of n blocks (32 * block + index in the block): chunk c (run
    c // n) lane 2i + e holds block i*n/8's value 16 (c // n) + 2 ((c % n) * 8/n + i % (8/n))
    + e"""
    per = GROUP // n  # int32 lanes per block
    out = np.zeros(32 * n, np.int64)
    for c in range(2 * n):
        run, cc = divmod(c, n)
        for lane in range(16):
            i, e = divmod(lane, 2)
            b, j = divmod(i, per)
            out[16 * c + lane] = 32 * b + SUB * run + 2 * (cc * per + j) + e
    return out


LAYOUT = np.zeros((3, 32 * GROUP), np.int64)  # rows: groups of 2, 4, 8 blocks (first 32n used)
for _k, _n in enumerate((2, 4, 8)):
    LAYOUT[_k, :32 * _n] = _layout(_n)


# ---------------------------------------------------------------- weights: repacked at load


def _codes(q4: bool, qs: np.ndarray, n: int) -> np.ndarray:
    """A group's code bytes [N, n, 16 or 32] -> [N, 16n or 32n] in the chunk layout"""
    if q4:
        vals = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.uint16)  # [N, n, 32]
    else:
        vals = qs.view(np.int8)
    slots = vals.reshape(qs.shape[0], 32 * n)[:, LAYOUT[(2, 4, 8).index(n), :32 * n]]
    if not q4:
        return slots.view(np.uint8)
    quads = slots.reshape(qs.shape[0], n // 2, 4, 16)
    words = (quads[:, :, 0] | quads[:, :, 1] << 4 | quads[:, :, 2] << 8 | quads[:, :, 3] << 12)
    return np.ascontiguousarray(words.astype("<u2")).view(np.uint8).reshape(qs.shape[0], -1)


def repack(q4: bool, rows: np.ndarray) -> tuple[int, np.ndarray]:
    """The GGUF's rows [N, row bytes] of Q4_1 (q4) or Q8_0 blocks -> (int16-path code, rows
    [N, bytes]) in the layout above."""
    nbytes = 20 if q4 else 34
    blocks = rows.reshape(rows.shape[0], -1, nbytes)
    if blocks.shape[1] % 2:  # a zero block: scales 0, codes 0 (Q8_0) / 0 (Q4_1: d = m = 0)
        blocks = np.concatenate([blocks, np.zeros_like(blocks[:, :1])], axis=1)
    parts, b = [], 0
    for n in group_sizes(blocks.shape[1]):
        g = blocks[:, b:b + n]
        scales = np.ascontiguousarray(g[:, :, :4 if q4 else 2])  # [N, n, 2 or 4] bytes
        parts.append(np.ascontiguousarray(scales[:, :, :2]).reshape(len(g), -1))  # d
        if q4:
            parts.append(np.ascontiguousarray(scales[:, :, 2:]).reshape(len(g), -1))  # m
        parts.append(_codes(q4, np.ascontiguousarray(g[:, :, 4 if q4 else 2:]), n))
        b += n
    return (Q4_1W if q4 else Q8_0W), np.ascontiguousarray(np.concatenate(parts, axis=1))


# ---------------------------------------------------------------- activations: one token at a time


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


@njit(forceinline=True, cache=True)
def _next_group(nb, b):
    """Blocks in the group starting at block b of a row of nb, and its LAYOUT row"""
    left = nb - b
    if left >= GROUP:
        return GROUP, 2
    if left >= 4:
        return 4, 1
    return 2, 0


@njit(cache=True)
def _quantize_row(x, xq, xsg, xs, codes):
    """One token: x [Kp] (Kp a multiple of 64) -> its rows of xq, xsg, xs; codes [Kp] int16
    scratch (the codes in the values' order, then dealt into the groups' slots)"""
    nb = x.shape[0] // 32
    b, g = 0, 0
    while b < nb:
        n, k = _next_group(nb, b)
        per = GROUP // n
        for i in range(n):
            total = np.float32(0.0)
            for r in range(RUNS):
                e = 32 * (b + i) + SUB * r
                d, inv = _scale(_amax(x, e, SUB))
                c = np.int32(0)
                for h in range(0, SUB, 8):
                    c += vround8_store(x, e + h, inv, codes, e + h)
                total += d * np.float32(c)
                for j in range(per):
                    xsg[16 * g + 8 * r + per * i + j] = d
            xs[8 * g + i] = total
        for s in range(32 * n):
            xq[32 * b + s] = codes[32 * b + LAYOUT[k, s]]
        b += n
        g += 1


@njit(cache=True)
def quantize(x):
    """x [L, Kp] float32 (Kp a multiple of 32) -> (xq int16 [L, nb*32], xsg float32 [L, G*16],
    xs float32 [L, G*8], blocks per row nb), each token alone (G groups; zeros after Kp)"""
    n, k = x.shape
    nb = -(-(k // 32) // 2) * 2
    if nb * 32 > k:  # an odd count of blocks: the zero block the weights got
        xp = np.zeros((n, nb * 32), np.float32)
        for t in range(n):  # loops, not a slice assignment: see matmul._padded
            for i in range(k):
                xp[t, i] = x[t, i]
        x = xp
    n_groups = nb // GROUP + 2
    xq = np.zeros((n, nb * 32), np.int16)
    xsg = np.zeros((n, n_groups * 16), np.float32)
    xs = np.zeros((n, n_groups * 8), np.float32)
    codes = np.empty(nb * 32, np.int16)
    for t in range(n):
        _quantize_row(x[t], xq[t], xsg[t], xs[t], codes)
    return xq, xsg, xs, nb


# ---------------------------------------------------------------- one group
# A row's group at byte o (n blocks): d at o, Q4_1's m at o + 2n, its codes at o + 2n (Q8_0)
# or o + 4n (Q4_1): quad q (chunks 4q..4q+3) 32 or 64 bytes each. Each function is specialized
# on q4 (a constant where the unit loops call the tiles).
# The helpers are `forceinline` (numba compiles each once per signature, LLVM inlines the code),
# not numba's `inline="always"`, which copies and re-types a helper's IR at every call site of
# the unrolled tiles: ~22 s of numba per entry point, ~46 s of the int16 kernel's first compile.


@njit(forceinline=True, cache=True)
def _quad(d, o, q4):
    """Chunks 4q..4q+3 of a group, the quad at byte o, as four 16 x int16"""
    if q4:
        return wload_u4w(d, o)
    return wload_i8(d, o), wload_i8(d, o + 16), wload_i8(d, o + 32), wload_i8(d, o + 48)


@njit(forceinline=True, cache=True)
def _dot4(w, xq, e):
    """The lanes' integer sums of a quad w and the 4 chunks of codes at element e"""
    return vadd32(vadd32(vmadd16(w[0], xload(xq, e)), vmadd16(w[1], xload(xq, e + 16))),
                  vadd32(vmadd16(w[2], xload(xq, e + 32)), vmadd16(w[3], xload(xq, e + 48))))


@njit(forceinline=True, cache=True)
def _dot2(w0, w1, xq, e):
    return vadd32(vmadd16(w0, xload(xq, e)), vmadd16(w1, xload(xq, e + 16)))


@njit(forceinline=True, cache=True)
def _finish(i, dws, x, t, g, r, acc):
    """acc after run r's lanes of integer sums i: fma(float(i), spread(d) * d_x, acc)"""
    xsg = x[1]
    return vfma8(vcvt8(i), vmul8(dws, fload(xsg, t * xsg.shape[1] + 16 * g + 8 * r)), acc)


@njit(forceinline=True, cache=True)
def _minimums(d, o, n, q4, x, t, g, acc):
    """Q4_1: acc after the group's m * s_x lanes (Q8_0: acc)"""
    if not q4:
        return acc
    xs = x[2]
    return vfma8(hload(d, o + 2 * n, n), fload(xs, t * xs.shape[1] + 8 * g), acc)


@njit(forceinline=True, cache=True)
def _group(d, o, n, q4, x, t, g, e, acc):
    """acc after the group at byte o (n blocks, activations at element e of xq) of token t"""
    xq, qb = x[0], 32 if q4 else 64
    acc = _minimums(d, o, n, q4, x, t, g, acc)
    dws = vspreadn(hload(d, o, n), n)
    c = o + (4 if q4 else 2) * n
    if n == GROUP:
        i = vadd32(_dot4(_quad(d, c, q4), xq, e), _dot4(_quad(d, c + qb, q4), xq, e + 64))
        acc = _finish(i, dws, x, t, g, 0, acc)
        i = vadd32(_dot4(_quad(d, c + 2 * qb, q4), xq, e + 128),
                   _dot4(_quad(d, c + 3 * qb, q4), xq, e + 192))
        return _finish(i, dws, x, t, g, 1, acc)
    if n == 4:
        acc = _finish(_dot4(_quad(d, c, q4), xq, e), dws, x, t, g, 0, acc)
        return _finish(_dot4(_quad(d, c + qb, q4), xq, e + 64), dws, x, t, g, 1, acc)
    w = _quad(d, c, q4)
    acc = _finish(_dot2(w[0], w[1], xq, e), dws, x, t, g, 0, acc)
    return _finish(_dot2(w[2], w[3], xq, e + 32), dws, x, t, g, 1, acc)


# ---------------------------------------------------------------- tiles


@njit(forceinline=True, cache=True)
def _ahead(d, o, q4):
    """Prefetch the lines AHEAD bytes past a group at byte o of a row (160 bytes for Q4_1,
    272 for Q8_0): a hint, so neither the results nor the order of any sum change"""
    for k in range(0, 192 if q4 else 320, 64):
        prefetch(d, o + AHEAD + k)


@njit(forceinline=True, cache=True)
def _rows4(d, o, q4, x, t):
    """(row at o[i] . token t for i < 4): one token, its activations loaded once for 4 rows"""
    nb, per, xq = x[3], 20 if q4 else 34, x[0]
    a = (vzero8(), vzero8(), vzero8(), vzero8())
    b, g = 0, 0
    while b < nb:
        n, _ = _next_group(nb, b)
        go, e = per * b, t * xq.shape[1] + 32 * b
        og = (o[0] + go, o[1] + go, o[2] + go, o[3] + go)
        _ahead(d, og[0], q4), _ahead(d, og[1], q4), _ahead(d, og[2], q4), _ahead(d, og[3], q4)
        a = (_group(d, og[0], n, q4, x, t, g, e, a[0]), _group(d, og[1], n, q4, x, t, g, e, a[1]),
             _group(d, og[2], n, q4, x, t, g, e, a[2]), _group(d, og[3], n, q4, x, t, g, e, a[3]))
        b += n
        g += 1
    return vsum8(a[0]), vsum8(a[1]), vsum8(a[2]), vsum8(a[3])


@njit(forceinline=True, cache=True)
def _tokens_first(w, xq, e):
    """4 tokens' integer sums of a quad w (unpacked once), e per token"""
    return _dot4(w, xq, e[0]), _dot4(w, xq, e[1]), _dot4(w, xq, e[2]), _dot4(w, xq, e[3])


@njit(forceinline=True, cache=True)
def _tokens_dot4(w, xq, e, i):
    """4 tokens' integer sums i after a quad w (unpacked once), e per token"""
    return (vadd32(i[0], _dot4(w, xq, e[0])), vadd32(i[1], _dot4(w, xq, e[1])),
            vadd32(i[2], _dot4(w, xq, e[2])), vadd32(i[3], _dot4(w, xq, e[3])))


@njit(forceinline=True, cache=True)
def _tokens_dot2(w0, w1, xq, e, k):
    return (_dot2(w0, w1, xq, e[0] + k), _dot2(w0, w1, xq, e[1] + k),
            _dot2(w0, w1, xq, e[2] + k), _dot2(w0, w1, xq, e[3] + k))


@njit(forceinline=True, cache=True)
def _tokens_finish(i, dws, x, t, g, r, a):
    return (_finish(i[0], dws, x, t[0], g, r, a[0]), _finish(i[1], dws, x, t[1], g, r, a[1]),
            _finish(i[2], dws, x, t[2], g, r, a[2]), _finish(i[3], dws, x, t[3], g, r, a[3]))


@njit(forceinline=True, cache=True)
def _plus(e, k):
    return e[0] + k, e[1] + k, e[2] + k, e[3] + k


@njit(forceinline=True, cache=True)
def _tokens4(d, o, q4, x, t):
    """(row at o . token t[j] for j < 4): each quad of weights unpacked once for 4 tokens"""
    nb, per, xq, qb = x[3], 20 if q4 else 34, x[0], 32 if q4 else 64
    a = (vzero8(), vzero8(), vzero8(), vzero8())
    b, g = 0, 0
    while b < nb:
        n, _ = _next_group(nb, b)
        og = o + per * b
        _ahead(d, og, q4)
        a = (_minimums(d, og, n, q4, x, t[0], g, a[0]),
             _minimums(d, og, n, q4, x, t[1], g, a[1]),
             _minimums(d, og, n, q4, x, t[2], g, a[2]),
             _minimums(d, og, n, q4, x, t[3], g, a[3]))
        dws = vspreadn(hload(d, og, n), n)
        c, w = og + (4 if q4 else 2) * n, xq.shape[1]
        e = (t[0] * w + 32 * b, t[1] * w + 32 * b, t[2] * w + 32 * b, t[3] * w + 32 * b)
        if n == GROUP:
            for r in range(RUNS):
                i = _tokens_first(_quad(d, c + 2 * r * qb, q4), xq, _plus(e, 128 * r))
                i = _tokens_dot4(_quad(d, c + (2 * r + 1) * qb, q4), xq, _plus(e, 128 * r + 64),
                                 i)
                a = _tokens_finish(i, dws, x, t, g, r, a)
        elif n == 4:
            for r in range(RUNS):
                i = _tokens_first(_quad(d, c + r * qb, q4), xq, _plus(e, 64 * r))
                a = _tokens_finish(i, dws, x, t, g, r, a)
        else:
            w = _quad(d, c, q4)
            a = _tokens_finish(_tokens_dot2(w[0], w[1], xq, e, 0), dws, x, t, g, 0, a)
            a = _tokens_finish(_tokens_dot2(w[2], w[3], xq, e, 32), dws, x, t, g, 1, a)
        b += n
        g += 1
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
def _trio_dot4(w, xq, e):
    return _dot4(w, xq, e[0]), _dot4(w, xq, e[1]), _dot4(w, xq, e[2])


@njit(forceinline=True, cache=True)
def _trio_add(i, j):
    return vadd32(i[0], j[0]), vadd32(i[1], j[1]), vadd32(i[2], j[2])


@njit(forceinline=True, cache=True)
def _trio_finish(i, dws, x, t, g, r, a):
    return (_finish(i[0], dws, x, t[0], g, r, a[0]), _finish(i[1], dws, x, t[1], g, r, a[1]),
            _finish(i[2], dws, x, t[2], g, r, a[2]))


@njit(forceinline=True, cache=True)
def _tokens3(d, o, q4, x, t):
    """(row at o . token t[j] for j < 3): _tokens4's tile for the last 3 tokens of a call"""
    nb, per, xq, qb = x[3], 20 if q4 else 34, x[0], 32 if q4 else 64
    a = (vzero8(), vzero8(), vzero8())
    b, g = 0, 0
    while b < nb:
        n, _ = _next_group(nb, b)
        og = o + per * b
        _ahead(d, og, q4)
        a = (_minimums(d, og, n, q4, x, t[0], g, a[0]),
             _minimums(d, og, n, q4, x, t[1], g, a[1]),
             _minimums(d, og, n, q4, x, t[2], g, a[2]))
        dws = vspreadn(hload(d, og, n), n)
        c, w = og + (4 if q4 else 2) * n, xq.shape[1]
        e = (t[0] * w + 32 * b, t[1] * w + 32 * b, t[2] * w + 32 * b)
        if n == GROUP:
            for r in range(RUNS):
                k = 128 * r
                i = _trio_dot4(_quad(d, c + 2 * r * qb, q4), xq, (e[0] + k, e[1] + k, e[2] + k))
                k += 64
                i = _trio_add(i, _trio_dot4(_quad(d, c + (2 * r + 1) * qb, q4), xq,
                                            (e[0] + k, e[1] + k, e[2] + k)))
                a = _trio_finish(i, dws, x, t, g, r, a)
        elif n == 4:
            for r in range(RUNS):
                k = 64 * r
                i = _trio_dot4(_quad(d, c + r * qb, q4), xq, (e[0] + k, e[1] + k, e[2] + k))
                a = _trio_finish(i, dws, x, t, g, r, a)
        else:
            w4 = _quad(d, c, q4)
            for r in range(RUNS):
                k = 32 * r
                i = (_dot2(w4[2 * r], w4[2 * r + 1], xq, e[0] + k),
                     _dot2(w4[2 * r], w4[2 * r + 1], xq, e[1] + k),
                     _dot2(w4[2 * r], w4[2 * r + 1], xq, e[2] + k))
                a = _trio_finish(i, dws, x, t, g, r, a)
        b += n
        g += 1
    return vsum8(a[0]), vsum8(a[1]), vsum8(a[2])


@njit(forceinline=True, cache=True)
def _pair_finish(i, dws, x, t, g, r, a):
    return _finish(i[0], dws, x, t[0], g, r, a[0]), _finish(i[1], dws, x, t[1], g, r, a[1])


@njit(forceinline=True, cache=True)
def _tokens2(d, o, q4, x, t):
    """(row at o . token t[j] for j < 2): _tokens4's tile for the last 2 tokens of a call"""
    nb, per, xq, qb = x[3], 20 if q4 else 34, x[0], 32 if q4 else 64
    a = (vzero8(), vzero8())
    b, g = 0, 0
    while b < nb:
        n, _ = _next_group(nb, b)
        og = o + per * b
        _ahead(d, og, q4)
        a = (_minimums(d, og, n, q4, x, t[0], g, a[0]),
             _minimums(d, og, n, q4, x, t[1], g, a[1]))
        dws = vspreadn(hload(d, og, n), n)
        c, w = og + (4 if q4 else 2) * n, xq.shape[1]
        e0, e1 = t[0] * w + 32 * b, t[1] * w + 32 * b
        if n == GROUP:
            for r in range(RUNS):
                w0, k = _quad(d, c + 2 * r * qb, q4), 128 * r
                w1 = _quad(d, c + (2 * r + 1) * qb, q4)
                i = (vadd32(_dot4(w0, xq, e0 + k), _dot4(w1, xq, e0 + k + 64)),
                     vadd32(_dot4(w0, xq, e1 + k), _dot4(w1, xq, e1 + k + 64)))
                a = _pair_finish(i, dws, x, t, g, r, a)
        elif n == 4:
            for r in range(RUNS):
                w0, k = _quad(d, c + r * qb, q4), 64 * r
                a = _pair_finish((_dot4(w0, xq, e0 + k), _dot4(w0, xq, e1 + k)), dws, x, t, g,
                                 r, a)
        else:
            w0 = _quad(d, c, q4)
            for r in range(RUNS):
                i = (_dot2(w0[2 * r], w0[2 * r + 1], xq, e0 + 32 * r),
                     _dot2(w0[2 * r], w0[2 * r + 1], xq, e1 + 32 * r))
                a = _pair_finish(i, dws, x, t, g, r, a)
        b += n
        g += 1
    return vsum8(a[0]), vsum8(a[1])


@njit(forceinline=True, cache=True)
def _tokens1(d, o, q4, x, t):
    """row at o . token t: the last token of a call, after the row's other tiles"""
    nb, per, xq = x[3], 20 if q4 else 34, x[0]
    a = vzero8()
    b, g = 0, 0
    while b < nb:
        n, _ = _next_group(nb, b)
        _ahead(d, o + per * b, q4)
        a = _group(d, o + per * b, n, q4, x, t, g, t * xq.shape[1] + 32 * b, a)
        b += n
        g += 1
    return vsum8(a)


@njit(forceinline=True, cache=True)
def _units_tokens(d, units, u0, u1, q4, x, t0, t1, out):
    t4 = t0 + (t1 - t0) // 4 * 4
    for u in range(u0, u1):
        r0, n = units[u, 0], units[u, 1]
        offs = unit_offsets(units[u])
        for i in range(n):
            for j in range(t0, t4, 4):
                s = _tokens4(d, offs[i], q4, x, (j, j + 1, j + 2, j + 3))
                for q in range(4):
                    out[j + q, r0 + i] = s[q]
            if t1 - t4 == 3:
                s3 = _tokens3(d, offs[i], q4, x, (t4, t4 + 1, t4 + 2))
                for q in range(3):
                    out[t4 + q, r0 + i] = s3[q]
            elif t1 - t4 == 2:
                s2 = _tokens2(d, offs[i], q4, x, (t4, t4 + 1))
                out[t4, r0 + i], out[t4 + 1, r0 + i] = s2[0], s2[1]
            elif t1 > t4:
                out[t4, r0 + i] = _tokens1(d, offs[i], q4, x, t4)


@njit(cache=True)
def units_tokens(d, units, u0, u1, x, t0, t1, out):
    """out[t, r] = row r . token t for the rows of units u0..u1-1 (all of one block type),
    t0 <= t < t1: each row in tiles of 4 tokens, then one of the 1, 2 or 3 left, while the
    row's weights are in L1 (a separate pass over the rows for each token left re-read
    them from L3 and cost nearly a 1-token forward's matmuls each)"""
    if units[u0, 2] == Q4_1W:
        _units_tokens(d, units, u0, u1, True, x, t0, t1, out)
    else:
        _units_tokens(d, units, u0, u1, False, x, t0, t1, out)
