"""The int8 numeric path: the weights' own Q4_1/Q8_0 blocks times activations quantized to int8
per 32 values, summed as integers (AVX-512 VNNI), as llama.cpp computes these types.

Not bit-identical to the float32 path (the activations are rounded to 8 bits), so it is a
numeric path of its own, never the default. It stays batch-invariant by construction: each
token's activations are quantized alone, integer sums are exact in any order, and every
(row, token) result is finished by the same float operations in one fixed order, whatever L is
or which tile computes it. The portable integer code gives the same bits as VNNI.

Layout. Four 32-weight blocks make a super-block of 128 weights; a row's last 1..3 blocks, when
its width is not a multiple of 128, make a tail in the same layout with only those blocks (a
576-wide row is 4 super-blocks and a tail of 2: no padding bytes). The tail is computed as a
super-block whose missing blocks are zeros (loaded masked), so it adds exact zeros. A token's
activations x are stored per super-block as 128 int8 codes in the order the weight bytes unpack:
bytes 16j..16j+15 hold block j's values 0..15, bytes 64+16j.. its values 16..31, so int32 lanes
4j..4j+3 of a `vdpbusd` hold block j. Per super-block and token, `xf` holds 16 lanes of d_x
(block j in lanes 4j..4j+3) then 16 lanes of s_x = d_x * sum(q_x) (block j in lane 4j, zeros
elsewhere); `xc` holds 128 * (the sum of each lane's 8 codes), which undoes Q8_0's +128 bias.

Per super-block of a row, token by token, in block order:
    Q4_1: acc = fma(m_w, s_x, fma(float(isum), d_w * d_x, acc))   (isum of the 4-bit codes)
    Q8_0: acc = fma(float(isum - xc), d_w * d_x, acc)             (isum of the codes + 128)
then the fixed tree of `simd.vsum` over acc's 16 lanes.
"""

import numpy as np
from numba import njit

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))
from kolibri_cli.engine.simd import (
    absmax32,
    vadd_i,
    vbytes,
    vcvt,
    vdpbusd,
    vfma,
    vhigh4,
    vhsum_i,
    vizero,
    vlane,
    vload,
    vload_b64,
    vload_b64_head,
    vload_i32,
    vlow4,
    vmul,
    vquads,
    vquads_head,
    vround_store,
    vstore_i32,
    vsub,
    vsum16,
    vzero,
)

Q4_1X, Q8_0X = 103, 108  # kernel storage codes of the int8 layouts (no GGML type uses them)
SB = 128  # weights per super-block


# ---------------------------------------------------------------- weights: repacked at load


def _super_blocks(rows: np.ndarray, block_bytes: int, layout) -> np.ndarray:
    """Rows [N, nb * block_bytes] (scales widened: `blocks.widen_scales`) -> the same shape:
    each run of 4 blocks (and the last 1..3) laid out by layout([N, S, j, block_bytes]) ->
    [N, S, j * block_bytes]"""
    n = rows.shape[0]
    blocks = rows.reshape(n, -1, block_bytes)
    full = blocks.shape[1] // 4 * 4
    parts = [layout(blocks[:, :full].reshape(n, -1, 4, block_bytes)).reshape(n, -1)]
    if full < blocks.shape[1]:
        parts.append(layout(blocks[:, None, full:]).reshape(n, -1))
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def _q4_1_layout(sb: np.ndarray) -> np.ndarray:
    """d[j], m[j], then the j blocks' 16 code bytes"""
    n, s, j = sb.shape[:3]
    return np.concatenate([sb[..., 0:4].reshape(n, s, 4 * j), sb[..., 4:8].reshape(n, s, 4 * j),
                           sb[..., 8:24].reshape(n, s, 16 * j)], axis=2)


def _q8_0_layout(sb: np.ndarray) -> np.ndarray:
    """d[j], codes 0..15 of each block, then codes 16..31, each code + 128 (unsigned)"""
    n, s, j = sb.shape[:3]
    codes = sb[..., 4:36] ^ np.uint8(0x80)
    return np.concatenate([sb[..., 0:4].reshape(n, s, 4 * j), codes[..., :16].reshape(n, s, 16 * j),
                           codes[..., 16:].reshape(n, s, 16 * j)], axis=2)


def repack_q4_1(rows: np.ndarray) -> np.ndarray:
    """Q4_1 rows with widened scales (blocks of float32 d, m, 16 code bytes) -> int8-path rows
    (same size):
    per super-block d[4] m[4] qs[64]"""
    return _super_blocks(rows, 24, _q4_1_layout)


def repack_q8_0(rows: np.ndarray) -> np.ndarray:
    """Q8_0 rows with widened scales (blocks of float32 d, 32 int8 codes) -> int8-path rows
    (same size):
    per super-block d[4], then codes 0..15 of each block, then codes 16..31, each + 128"""
    return _super_blocks(rows, 36, _q8_0_layout)


# ---------------------------------------------------------------- activations: one token at a time


@njit(inline="always", cache=True)
def _block_scale(x, e):
    """(d, 1/d) of the 32 values at element e of x: d = max|x| / 127; (0, 0) when the inverse
    would overflow (activations that small quantize to zeros)"""
    d = absmax32(x, e) / np.float32(127.0)
    inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
    if not np.isfinite(inv):
        return np.float32(0.0), np.float32(0.0)
    return d, inv


@njit(cache=True)
def _quantize_row(x, xq, xf, xc):
    """One token: x [Kp] (Kp a multiple of 32) -> its rows of xq, xf, xc"""
    for b in range(x.shape[0] // 32):
        s, j = b >> 2, b & 3
        d, inv = _block_scale(x, 32 * b)
        q = vadd_i(vround_store(x, 32 * b, inv, xq, SB * s + 16 * j),
                   vround_store(x, 32 * b + 16, inv, xq, SB * s + 64 + 16 * j))
        for k in range(4):
            xf[32 * s + 4 * j + k] = d
        xf[32 * s + 16 + 4 * j] = d * np.float32(vhsum_i(q))
    for s in range(xc.shape[0] // 16):
        c = vdpbusd(vizero(), vbytes(128), vload_b64(xq, SB * s))
        vstore_i32(xc, 16 * s, vdpbusd(c, vbytes(128), vload_b64(xq, SB * s + 64)))


@njit(cache=True)
def quantize(x):
    """x [L, Kp] float32 (Kp a multiple of 32) -> (xq int8 [L, S*128], xf float32 [L, S*32],
    xc int32 [L, S*16], Kp // 32), each token alone (S = Kp / 128 rounded up: zeros after Kp)"""
    n, k = x.shape
    s_n = -(-k // SB)
    xq = np.zeros((n, s_n * SB), np.int8)
    xf = np.zeros((n, s_n * 32), np.float32)
    xc = np.zeros((n, s_n * 16), np.int32)
    for t in range(n):
        _quantize_row(x[t], xq[t], xf[t], xc[t])
    return xq, xf, xc, k // 32


# ---------------------------------------------------------------- one super-block, one token
# w_T(d, o, j) -> the row's super-block (j = 4) or tail of j < 4 blocks at byte o in registers;
# t_T(w, x, t, s, acc) -> acc after super-block s of token t (x = `quantize`'s tuple). Token work
# never depends on other tokens.


@njit(inline="always", cache=True)
def w_q4_1x(d, o, j):
    if j == 4:
        q = vload_b64(d, o + 32)
        return vquads(d, o), vquads(d, o + 16), vlow4(q), vhigh4(q)
    q = vload_b64_head(d, o + 8 * j, 16 * j)
    return vquads_head(d, o, j), vquads_head(d, o + 4 * j, j), vlow4(q), vhigh4(q)


@njit(inline="always", cache=True)
def _isum(w, x, t, s):
    """(the super-block's integer dot lanes, the offset of token t's xf lanes)"""
    xq, xf = x[0], x[1]
    qo = t * xq.shape[1] + SB * s
    i = vdpbusd(vdpbusd(vizero(), w[2], vload_b64(xq, qo)), w[3], vload_b64(xq, qo + 64))
    return i, t * xf.shape[1] + 32 * s


@njit(inline="always", cache=True)
def t_q4_1x(w, x, t, s, acc):
    i, fo = _isum(w, x, t, s)
    acc = vfma(vcvt(i), vmul(w[0], vload(x[1], fo)), acc)
    return vfma(w[1], vload(x[1], fo + 16), acc)


@njit(inline="always", cache=True)
def w_q8_0x(d, o, j):
    if j == 4:
        return vquads(d, o), vzero(), vload_b64(d, o + 16), vload_b64(d, o + 80)
    return (vquads_head(d, o, j), vzero(), vload_b64_head(d, o + 4 * j, 16 * j),
            vload_b64_head(d, o + 20 * j, 16 * j))


@njit(inline="always", cache=True)
def t_q8_0x(w, x, t, s, acc):
    i, fo = _isum(w, x, t, s)
    i = vsub(i, vload_i32(x[2], t * x[2].shape[1] + 16 * s))
    return vfma(vcvt(i), vmul(w[0], vload(x[1], fo)), acc)


# ---------------------------------------------------------------- tiles


@njit(inline="always", cache=True)
def _rows4_of(w_of, t_of, step, a):
    """Lanes 0..3 = rows at o0..o3 . token t"""
    d, o0, o1, o2, o3, x, t = a
    a0 = a1 = a2 = a3 = vzero()
    for s in range(-(-x[3] // 4)):
        ob, j = 4 * step * s, min(4, x[3] - 4 * s)
        a0 = t_of(w_of(d, o0 + ob, j), x, t, s, a0)
        a1 = t_of(w_of(d, o1 + ob, j), x, t, s, a1)
        a2 = t_of(w_of(d, o2 + ob, j), x, t, s, a2)
        a3 = t_of(w_of(d, o3 + ob, j), x, t, s, a3)
    z = vzero()
    return vsum16(a0, a1, a2, a3, z, z, z, z, z, z, z, z, z, z, z, z)


@njit(inline="always", cache=True)
def _pair3_of(w_of, t_of, step, a):
    """Lanes 3i + j = row at o_i . token t_j (i < 2, j < 3): each super-block decoded once for
    three tokens, each token's codes loaded once for two rows"""
    d, oa, ob, x, t0, t1, t2 = a
    a0 = a1 = a2 = b0 = b1 = b2 = vzero()
    for s in range(-(-x[3] // 4)):
        j = min(4, x[3] - 4 * s)
        wa, wb = w_of(d, oa + 4 * step * s, j), w_of(d, ob + 4 * step * s, j)
        a0, b0 = t_of(wa, x, t0, s, a0), t_of(wb, x, t0, s, b0)
        a1, b1 = t_of(wa, x, t1, s, a1), t_of(wb, x, t1, s, b1)
        a2, b2 = t_of(wa, x, t2, s, a2), t_of(wb, x, t2, s, b2)
    z = vzero()
    return vsum16(a0, a1, a2, b0, b1, b2, z, z, z, z, z, z, z, z, z, z)


@njit(inline="always", cache=True)
def _typed(t, op, a):
    """op(weights loader, token step, bytes per block, a)"""
    if t == Q4_1X:
        return op(w_q4_1x, t_q4_1x, 24, a)
    return op(w_q8_0x, t_q8_0x, 36, a)


@njit(inline="always", cache=True)
def unit_offsets(unit):
    """The unit's 4 row offsets (its n rows, the last repeated; extra results discarded)"""
    n, o, stride = unit[1], unit[3], unit[4]
    return (o, o + min(1, n - 1) * stride, o + min(2, n - 1) * stride,
            o + min(3, n - 1) * stride)


@njit(cache=True)
def _one_token(d, unit, x, t, out):
    """out[t, r] = row r . token t for the unit's rows"""
    r0, n = unit[0], unit[1]
    o0, o1, o2, o3 = unit_offsets(unit)
    s = _typed(unit[2], _rows4_of, (d, o0, o1, o2, o3, x, t))
    for i in range(n):
        out[t, r0 + i] = vlane(s, i)


@njit(cache=True)
def units_one_token(d, units, u0, u1, x, out):
    """out[r] = row r . token 0 for the rows of units u0..u1-1   out [N]"""
    for u in range(u0, u1):
        _one_token(d, units[u], x, 0, out.reshape(1, -1))


@njit(cache=True)
def units_tokens(d, units, u0, u1, x, t0, t1, out):
    """out[t, r] = row r . token t for the rows of units u0..u1-1, t0 <= t < t1, in tiles of
    2 rows x 3 tokens (a short tile repeats its last token; extra results discarded), a last
    lone token in the 4-row tile of one token"""
    for u in range(u0, u1):
        r0, n = units[u, 0], units[u, 1]
        offs = unit_offsets(units[u])
        t3 = t1 - 1 if (t1 - t0) % 3 == 1 else t1
        for p in range(0, n, 2):
            for j in range(t0, t3, 3):
                jn = min(3, t3 - j)
                last = j + jn - 1
                s = _typed(units[u, 2], _pair3_of, (d, offs[p], offs[p + 1], x, j,
                                                    min(j + 1, last), last))
                for i in range(min(2, n - p)):
                    for q in range(jn):
                        out[j + q, r0 + p + i] = vlane(s, 3 * i + q)
        if t3 < t1:
            _one_token(d, units[u], x, t3, out)
