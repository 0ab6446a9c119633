"""Weight storage types: GGUF's quantized blocks and float rows, decoded 32 weights at a time into
float32 vectors, each weight bit-exact with `gguf.quants.dequantize`.

gguf computes every weight with one short expression — Q4_1 fl(d*q + m), Q8_0 fl(d*q), Q4_0
fl(d*(q-8)), Q4_K/Q5_K fl((d*sc)*q - dmin*m), Q6_K fl((d*sc)*(q-32)) — and every product in them
is exact in float32 (a float16 scale has 11 significant bits, the codes and sub-scales at most
13 more), so each weight is one rounding of an exact value. A 16-entry table fl(i*d + m), looked
up by the 4-bit codes (`vperm`), therefore gives exactly gguf's floats, as does computing them.

Kernel storage is the GGUF's own blocks, read in place from the memory-mapped file: the float16
scales are widened in registers (exact), K-quant super-blocks and float rows are as in the file.
Float rows must be a multiple of 32 weights wide to be read in place (else a padded copy is
stored). Non-goals: the I-quants, Q2_K/Q3_K, TQ — they are dequantized to F32 at import.
"""

from dataclasses import dataclass

import numpy as np
from numba import njit

from kolibri_cli.engine import int8, int16, jitcache  # noqa: F401  (jitcache before any @njit)
from kolibri_cli.engine.simd import (
    LUT,
    f16,
    k_scale_codes,
    u32,
    vand,
    vbcast,
    vcvt,
    vfma,
    vhalves,
    vibcast,
    viota,
    viota16,
    vlanes,
    vload,
    vload_bf16,
    vload_f16,
    vload_i8,
    vload_u8,
    vmul,
    vor,
    vperm,
    vperm2,
    vshl,
    vshr,
    vsplat,
    vsub,
    vzero,
)


@dataclass(frozen=True)
class BlockType:
    name: str  # as GGUF names it
    code: int  # GGML type number; the kernel dispatches on it
    weights: int  # per block
    bytes: int  # per block, in a GGUF file and in kernel storage

    def row_bytes(self, k: int) -> int:
        """Bytes of a row of k weights in kernel storage (float rows padded to 32 weights)."""
        return -(-k // self.weights) * self.bytes


F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
TYPES = {t.code: t for t in [
    BlockType("F32", F32, 32, 128), BlockType("F16", F16, 32, 64),
    BlockType("BF16", BF16, 32, 64),
    BlockType("Q4_0", Q4_0, 32, 18), BlockType("Q4_1", Q4_1, 32, 20),
    BlockType("Q5_0", Q5_0, 32, 22), BlockType("Q5_1", Q5_1, 32, 24),
    BlockType("Q8_0", Q8_0, 32, 34),
    BlockType("Q4_K", Q4_K, 256, 144), BlockType("Q5_K", Q5_K, 256, 176),
    BlockType("Q6_K", Q6_K, 256, 210),
    # the int8 path's layouts of Q4_1 and Q8_0 rows (never in a file: built at load)
    BlockType("Q4_1x8", int8.Q4_1X, 32, 24),
    BlockType("Q8_0x8", int8.Q8_0X, 32, 36),
    # the int16 path's (built at load; counted per pair of blocks, its unit of storage)
    BlockType("Q4_1x16", int16.Q4_1W, 64, 40),
    BlockType("Q8_0x16", int16.Q8_0W, 64, 68),
]}
BY_NAME = {t.name: t for t in TYPES.values()}
_HALVES = {Q4_0: 1, Q4_1: 2, Q5_0: 1, Q5_1: 2, Q8_0: 1}  # leading float16 scales to widen


def widen_scales(code: int, raw: np.ndarray) -> np.ndarray:
    """Rows [N, row bytes] of a 32-weight type with their leading float16 scales as float32
    (2-4 bytes more per block): what the int8 path's layouts are built from."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, TYPES[code].bytes)
    h = 2 * _HALVES[code]
    scales = blocks[:, :, :h].copy().view(np.float16).astype(np.float32).view(np.uint8)
    return np.concatenate([scales, blocks[:, :, h:]], axis=2).reshape(rows, -1)


def narrow_scales(code: int, rows: np.ndarray) -> np.ndarray:
    """`widen_scales` undone: rows [N, row bytes with float32 scales] -> the GGUF's blocks (a
    no-op for the types without per-block float16 scales). Refuses scales that are not float16
    numbers, which no GGUF gave."""
    if code not in _HALVES:
        return np.ascontiguousarray(rows)
    h = 2 * _HALVES[code]
    n = rows.shape[0]
    blocks = np.ascontiguousarray(rows).reshape(n, -1, TYPES[code].bytes + h)
    wide = blocks[:, :, :2 * h].copy().view(np.float32)
    half = wide.astype(np.float16)
    if not np.array_equal(half.astype(np.float32).view(np.uint32), wide.view(np.uint32)):
        raise ValueError("block scales are not float16 numbers")
    return np.concatenate([half.view(np.uint8), blocks[:, :, 2 * h:]], axis=2).reshape(n, -1)


def float_rows(code: int, w: np.ndarray) -> np.ndarray:
    """Float rows [N, K] -> kernel storage rows (F32, F16 or BF16), zero-padded to 32 weights."""
    n, k = w.shape
    kp = -(-k // 32) * 32
    dtype = {F32: np.float32, F16: np.float16, BF16: np.uint16}[code]
    out = np.zeros((n, kp), dtype)
    if code == BF16:  # w holds the bfloat16 bit patterns
        out[:, :k] = w.view(np.uint16) if w.dtype == np.uint16 else _bf16_bits(w)
    else:
        out[:, :k] = w
    return out.view(np.uint8)


def _bf16_bits(w: np.ndarray) -> np.ndarray:
    """The top halves of float32 values that are exact bfloat16 numbers."""
    bits = np.ascontiguousarray(w, np.float32).view(np.uint32)
    if (bits & 0xFFFF).any():
        raise ValueError("values are not bfloat16 numbers")
    return (bits >> 16).astype(np.uint16)


# ---------------------------------------------------------------- decoding, 32 weights a part
# part_T(d, o, p, v) -> (weights 32p .. 32p+15, weights 32p+16 .. 32p+31) of the block at byte o
# of d; p = 0 for the 32-weight types, 0..7 for the 256-weight K-quant super-blocks, whose
# sub-block scales scales_T(d, o) unpacks once per super-block into the vector v.


@njit(inline="always", cache=True)
def _table(scale, shift):
    """t[i] = fl(i*scale + shift) for i < 16   (scale, shift: vectors)"""
    return vfma(viota(), scale, shift)


@njit(inline="always", cache=True)
def _nibbles(t, v, scale, shift):
    """the weights of the 4-bit codes in the low bits of v: t[v], or the same floats computed"""
    if LUT:
        return vperm(t, v)
    return vfma(vcvt(vand(v, vibcast(15))), scale, shift)


@njit(inline="always", cache=True)
def _five(scale, shift, q):
    """the weights fl(q*scale + shift) of the 5-bit codes q   (scale, shift: vectors)"""
    if LUT:
        return vperm2(_table(scale, shift), q, vfma(viota16(), scale, shift))
    return vfma(vcvt(q), scale, shift)


@njit(inline="always", cache=True)
def _centered(s, q, c):
    """fl(s*(q - c)) for the codes q (exact products; -0 where gguf has -0)   s: vector"""
    return vmul(s, vcvt(vsub(q, vibcast(c))))


@njit(inline="always", cache=True)
def _low(v):
    return vand(v, vibcast(15))


@njit(inline="always", cache=True)
def _high(v):
    return vshr(v, vibcast(4))


@njit(inline="always", cache=True)
def no_scales(d, o):
    """the 32-weight types keep their scales in each block"""
    return vzero()


@njit(inline="always", cache=True)
def part_f32(d, o, p, v):
    return vload(d, o), vload(d, o + 64)


@njit(inline="always", cache=True)
def part_f16(d, o, p, v):
    return vload_f16(d, o), vload_f16(d, o + 32)


@njit(inline="always", cache=True)
def part_bf16(d, o, p, v):
    return vload_bf16(d, o), vload_bf16(d, o + 32)


@njit(inline="always", cache=True)
def part_q4_0(d, o, p, v):
    s = vbcast(f16(d, o))
    q = vload_u8(d, o + 2)
    if LUT:
        t = vmul(s, vcvt(vsub(vlanes(), vibcast(8))))
        return vperm(t, q), vperm(t, _high(q))
    return _centered(s, _low(q), 8), _centered(s, _high(q), 8)


@njit(inline="always", cache=True)
def part_q4_1(d, o, p, v):
    s, m = vbcast(f16(d, o)), vbcast(f16(d, o + 2))
    t = _table(s, m)
    q = vload_u8(d, o + 4)
    return _nibbles(t, q, s, m), _nibbles(t, _high(q), s, m)


@njit(inline="always", cache=True)
def _q5_codes(d, oh, oq):
    """5-bit codes of a Q5_0/Q5_1 block: nibble | (bit j of the word at oh) << 4"""
    hb = vshr(vibcast(u32(d, oh)), vlanes())
    q = vload_u8(d, oq)
    one, four = vibcast(1), vibcast(4)
    lo = vor(_low(q), vshl(vand(hb, one), four))
    hi = vor(_high(q), vshl(vand(vshr(hb, vibcast(16)), one), four))
    return lo, hi


@njit(inline="always", cache=True)
def part_q5_0(d, o, p, v):
    s = vbcast(f16(d, o))
    lo, hi = _q5_codes(d, o + 2, o + 6)
    if LUT:
        t0 = vmul(s, vcvt(vsub(vlanes(), vibcast(16))))
        t1 = vmul(s, vcvt(vlanes()))
        return vperm2(t0, lo, t1), vperm2(t0, hi, t1)
    return _centered(s, lo, 16), _centered(s, hi, 16)


@njit(inline="always", cache=True)
def part_q5_1(d, o, p, v):
    s, m = vbcast(f16(d, o)), vbcast(f16(d, o + 2))
    lo, hi = _q5_codes(d, o + 4, o + 8)
    return _five(s, m, lo), _five(s, m, hi)


@njit(inline="always", cache=True)
def part_q8_0(d, o, p, v):
    s = vbcast(f16(d, o))
    return vmul(vcvt(vload_i8(d, o + 2)), s), vmul(vcvt(vload_i8(d, o + 18)), s)


@njit(inline="always", cache=True)
def scales_k(d, o):
    """Q4_K/Q5_K super-block at o -> lanes 0..7 d*scale[s], lanes 8..15 -(dmin*min[s])
    (exact products; the 12 packed bytes unpacked in one go)"""
    dm = vhalves(vbcast(f16(d, o)), vbcast(-f16(d, o + 2)))
    return vmul(vcvt(k_scale_codes(d, o + 4)), dm)


@njit(inline="always", cache=True)
def _nibble_pair(d, q, p):
    """sub-block p's 32 codes: bytes q..q+31, low nibbles for even p, high for odd"""
    v0, v1 = vload_u8(d, q), vload_u8(d, q + 16)
    if p & 1:
        return _high(v0), _high(v1)
    return _low(v0), _low(v1)


@njit(inline="always", cache=True)
def part_q4_k(d, o, p, v):
    s, n = vsplat(v, p), vsplat(v, 8 + p)
    q0, q1 = _nibble_pair(d, o + 16 + 32 * (p >> 1), p)
    t = _table(s, n)
    return _nibbles(t, q0, s, n), _nibbles(t, q1, s, n)


@njit(inline="always", cache=True)
def part_q5_k(d, o, p, v):
    s, n = vsplat(v, p), vsplat(v, 8 + p)
    q0, q1 = _nibble_pair(d, o + 48 + 32 * (p >> 1), p)
    bit, one, four = vibcast(p), vibcast(1), vibcast(4)
    h0 = vshl(vand(vshr(vload_u8(d, o + 16), bit), one), four)
    h1 = vshl(vand(vshr(vload_u8(d, o + 32), bit), one), four)
    return _five(s, n, vor(q0, h0)), _five(s, n, vor(q1, h1))


@njit(inline="always", cache=True)
def scales_q6_k(d, o):
    """Q6_K super-block at o -> lane g = d * scale[g] (weights 16g .. 16g+15), exact"""
    return vmul(vcvt(vload_i8(d, o + 192)), vbcast(f16(d, o + 208)))


@njit(inline="always", cache=True)
def part_q6_k(d, o, p, v):
    """Q6_K: weights 128n + 32g + i take the low (g < 2) or high nibble of ql[64n + 32(g&1) + i]
    and bits 2g, 2g+1 of qh[32n + i], n = p // 4, g = p % 4"""
    n, g = p >> 2, p & 3
    ql = o + 64 * n + 32 * (g & 1)
    a, b = vload_u8(d, ql), vload_u8(d, ql + 16)
    if g >= 2:
        a, b = _high(a), _high(b)
    else:
        a, b = _low(a), _low(b)
    shift, three, four = vibcast(2 * g), vibcast(3), vibcast(4)
    ha = vshl(vand(vshr(vload_u8(d, o + 128 + 32 * n), shift), three), four)
    hb = vshl(vand(vshr(vload_u8(d, o + 144 + 32 * n), shift), three), four)
    return (_centered(vsplat(v, 2 * p), vor(a, ha), 32),
            _centered(vsplat(v, 2 * p + 1), vor(b, hb), 32))
