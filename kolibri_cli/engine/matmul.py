"""Batch-invariant matmul over block storage: out = x @ w.T, w stored as GGUF blocks or float rows.

Every (row, token) dot product is summed in one order, whatever the storage type, the number of
tokens L in the call, or the tile: 16 lanes, lane l a chain of fused multiply-adds over
k = l, l+16, ... (increasing k), then the fixed tree of `simd.vsum`. A quantized row therefore
gives bitwise the float32 row's result, and a token's logits do not depend on L.

A matrix is the tuple (data, units): `data` a uint8 buffer (a memory map of the model cache, or
owned), `units` int64 [U, 5] rows of (first row, rows n <= 4, block type, byte offset, row
stride). A unit's rows sit at offset + i*stride; a fused QKV or gate/up matrix is the units of its
parts one after another (parts may differ in block type, as in Q4_K_M files).

Decode (L = 1) decodes each part of 32 weights into registers and multiplies it at once (four
rows share each load of x; two on CPUs without AVX-512, whose 16 vector registers four rows'
sums overflow). Verify passes (1 < L <= FEW) do the same for groups of up to 8
tokens, 2-4 with the unit's 4 rows, 5-8 with 2 rows at a time (at most 16 sums in registers):
each part decoded once per group, never stored. Prefill (L > FEW) decodes a unit's rows once
into a float32 scratch in L1, then runs register tiles of 4 rows x 4 tokens over token blocks of
TB, so the weights are read from memory once per TB tokens and decoded once per block.
"""

import numpy as np
from numba import njit, prange
from numba.core import types as nbtypes
from numba.extending import overload

from kolibri_cli.engine import clock, int8, int16
from kolibri_cli.engine.blocks import (
    BF16,
    F16,
    F32,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    no_scales,
    part_bf16,
    part_f16,
    part_f32,
    part_q4_0,
    part_q4_1,
    part_q4_k,
    part_q5_0,
    part_q5_1,
    part_q5_k,
    part_q6_k,
    part_q8_0,
    scales_k,
    scales_q6_k,
)
from kolibri_cli.engine.jit import ONE
from kolibri_cli.engine.simd import LUT, vfma, vlane, vload, vstore, vsum16, vzero

R = 4  # weight rows per unit
TB = 64  # tokens per block when L > FEW: the block [TB, K] of x stays in L2
FEW = 32  # up to this many tokens (verify passes), each part is decoded once per group
ORDER = (Q4_1, Q8_0, Q4_K, Q6_K, Q5_K, Q4_0, Q5_0, Q5_1, F16, BF16, F32)  # dispatch order

# ---------------------------------------------------------------- what a compiled kernel handles
# A kernel call carries a `spec`: a tuple whose element TYPES say what the call may meet — each
# block type of ORDER, the verify tiles (FEW), the int8 path, draft trees, the int16 path —
# np.bool_ for yes,
# np.int8 for no; its values are never read. numba compiles one specialization per spec type
# (and caches it like any signature), and each dispatch below is an overload that compiles only
# the branches its spec names: a model's first token waits for its own block types' decoders
# and the paths that token takes, not for all of them (the rest compile when first used).
# Results never depend on the spec: a specialization computes every row it can meet exactly as
# any other (the same expressions in the same order), so the bits are the same.

FEW_AT, INT8_AT, TREE_AT, INT16_AT = (len(ORDER) + i for i in range(4))  # spec positions


def spec_of(codes, few: bool = True, int8_path: bool = False, tree: bool = False,
            int16_path: bool = False) -> tuple:
    """The spec of a call over matrices of block types `codes` (others never met)."""
    flags = [c in codes for c in ORDER] + [few, int8_path, tree, int16_path]
    return tuple(np.bool_(True) if f else np.int8(0) for f in flags)


ALL = spec_of(ORDER, few=True, int8_path=True, tree=True, int16_path=True)  # everything (tests)


def spec_on(spec, i: int) -> bool:
    """At compile time: whether the spec type `spec` says yes at position i."""
    return isinstance(spec.types[i], nbtypes.Boolean)


def _types_on(spec) -> tuple[bool, ...]:
    return tuple(spec_on(spec, i) for i in range(len(ORDER)))


# ---------------------------------------------------------------- decode: one token, 4 rows


def _typed(op):
    """`typed(t, a, spec)` = op(part, scales, weights per block, parts per block, bytes per
    block, a) with the decoder of block type t: the dispatch on the type of decode and prefill
    (verify: `_verify_tile`), compiled for the types the spec names (any other: F32's). op is
    named in the compiled code (a closure's), never passed: passed, numba would keep the
    decoders as Python objects and refuse to cache the kernel."""

    def typed(t, a, spec):
        raise NotImplementedError("compiled code only")

    @overload(typed, inline="always")
    def typed_for(t, a, spec):
        q41, q80, q4k, q6k, q5k, q40, q50, q51, f16, bf16, _ = _types_on(spec)

        def impl(t, a, spec):
            if q41 and t == Q4_1:
                return op(part_q4_1, no_scales, 32, 1, 20, a)
            if q80 and t == Q8_0:
                return op(part_q8_0, no_scales, 32, 1, 34, a)
            if q4k and t == Q4_K:
                return op(part_q4_k, scales_k, 256, 8, 144, a)
            if q6k and t == Q6_K:
                return op(part_q6_k, scales_q6_k, 256, 8, 210, a)
            if q5k and t == Q5_K:
                return op(part_q5_k, scales_k, 256, 8, 176, a)
            if q40 and t == Q4_0:
                return op(part_q4_0, no_scales, 32, 1, 18, a)
            if q50 and t == Q5_0:
                return op(part_q5_0, no_scales, 32, 1, 22, a)
            if q51 and t == Q5_1:
                return op(part_q5_1, no_scales, 32, 1, 24, a)
            if f16 and t == F16:
                return op(part_f16, no_scales, 32, 1, 64, a)
            if bf16 and t == BF16:
                return op(part_bf16, no_scales, 32, 1, 64, a)
            return op(part_f32, no_scales, 32, 1, 128, a)

        return impl

    return typed


@njit(inline="always", cache=True)
def _dot4_of(part, scales, per_block, parts, nbytes, a):
    """Lanes 0..3 = rows at o0..o3 . x[:kp] (each in the fixed order)   a = (d, o0..o3, x, kp)"""
    d, o0, o1, o2, o3, x, kp = a
    a0 = a1 = a2 = a3 = vzero()
    for b in range(kp // per_block):
        ob = nbytes * b
        v0, v1 = scales(d, o0 + ob), scales(d, o1 + ob)
        v2, v3 = scales(d, o2 + ob), scales(d, o3 + ob)
        for p in range(parts):
            e = per_block * b + 32 * p
            x0, x1 = vload(x, e), vload(x, e + 16)
            lo, hi = part(d, o0 + ob, p, v0)
            a0 = vfma(hi, x1, vfma(lo, x0, a0))
            lo, hi = part(d, o1 + ob, p, v1)
            a1 = vfma(hi, x1, vfma(lo, x0, a1))
            lo, hi = part(d, o2 + ob, p, v2)
            a2 = vfma(hi, x1, vfma(lo, x0, a2))
            lo, hi = part(d, o3 + ob, p, v3)
            a3 = vfma(hi, x1, vfma(lo, x0, a3))
    z = vzero()
    return vsum16(a0, a1, a2, a3, z, z, z, z, z, z, z, z, z, z, z, z)


_dot4_typed = _typed(_dot4_of)


@njit(cache=True)
def _dot4(t, d, o0, o1, o2, o3, x, kp, spec):
    return _dot4_typed(t, (d, o0, o1, o2, o3, x, kp), spec)


@njit(inline="always", cache=True)
def _dot2_of(part, scales, per_block, parts, nbytes, a):
    """Lanes 0, 1 = rows at o0, o1 . x[:kp], each in _dot4_of's order: half its registers, for
    CPUs with 16 vector registers (AVX2), where _dot4_of's 4 rows spill   a = (d, o0, o1, x, kp)"""
    d, o0, o1, x, kp = a
    a0 = a1 = vzero()
    for b in range(kp // per_block):
        ob = nbytes * b
        v0, v1 = scales(d, o0 + ob), scales(d, o1 + ob)
        for p in range(parts):
            e = per_block * b + 32 * p
            x0, x1 = vload(x, e), vload(x, e + 16)
            lo, hi = part(d, o0 + ob, p, v0)
            a0 = vfma(hi, x1, vfma(lo, x0, a0))
            lo, hi = part(d, o1 + ob, p, v1)
            a1 = vfma(hi, x1, vfma(lo, x0, a1))
    z = vzero()
    return vsum16(a0, a1, z, z, z, z, z, z, z, z, z, z, z, z, z, z)


_dot2_typed = _typed(_dot2_of)


@njit(cache=True)
def _dot2(t, d, o0, o1, x, kp, spec):
    return _dot2_typed(t, (d, o0, o1, x, kp), spec)


@njit(inline="always", cache=True)
def _row_offsets(o, stride, n):
    """The 4 rows a unit computes: its n rows, the last repeated (extra results discarded)"""
    return o, o + min(1, n - 1) * stride, o + min(2, n - 1) * stride, o + min(3, n - 1) * stride


@njit(inline="always", cache=True)
def _decode_unit(d, unit, x, out, spec):
    """out[r0 + i] = row i . x for the unit's rows   x [Kp], out [N]"""
    r0, n, t, o, stride = unit[0], unit[1], unit[2], unit[3], unit[4]
    o0, o1, o2, o3 = _row_offsets(o, stride, n)
    if LUT:
        s = _dot4(t, d, o0, o1, o2, o3, x, x.shape[0], spec)
        for i in range(n):
            out[r0 + i] = vlane(s, i)
        return
    s = _dot2(t, d, o0, o1, x, x.shape[0], spec)
    for i in range(min(n, 2)):
        out[r0 + i] = vlane(s, i)
    if n > 2:
        s = _dot2(t, d, o2, o3, x, x.shape[0], spec)
        for i in range(n - 2):
            out[r0 + 2 + i] = vlane(s, i)


# ---------------------------------------------------------------- a few tokens (verify)
# Each block type's verify tiles (one per token count: 2, 3-4, 5, 6, 7, 8) are one function of
# their own, `_verify_unit(t)`, called once per unit: numba's passes take time growing faster
# than a function's size (its SSA pass with the square), so the 44 copies of the 2x8 tile in one
# function took 67 s to compile, 11 functions of 6 tiles ~47 s. The tiles are inlined there:
# compiled apart (66 functions, ~28 s), the default model's verify passes ran 5-8% slower at 2,
# 5 or 6 tokens, called through a dispatch function or straight from the unit loop (its units
# are short, K = 576). _fma32 is left to LLVM to inline (it does): inlined by numba, it doubled
# the tiles' compile.


@njit(cache=True)
def _fma32(lo, hi, x, e, acc):
    """acc after the part lo, hi times x[e : e+32]: the two FMAs of every tile, in their order"""
    return vfma(hi, vload(x, e + 16), vfma(lo, vload(x, e), acc))


@njit(inline="always", cache=True)
def _dot4xg_of(part, scales, per_block, parts, nbytes, a):
    """Lane 4i + q = row at o_i . token at element j_q of x (q < jn, 2 <= jn <= 4): each part
    decoded in registers once for the jn tokens   a = (d, o0..o3, x, j0..j3, jn, kp)"""
    d, o0, o1, o2, o3, x, j0, j1, j2, j3, jn, kp = a
    z = vzero()
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = z
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = z
    for b in range(kp // per_block):
        ob = nbytes * b
        v0, v1 = scales(d, o0 + ob), scales(d, o1 + ob)
        v2, v3 = scales(d, o2 + ob), scales(d, o3 + ob)
        for p in range(parts):
            e = per_block * b + 32 * p
            lo0, hi0 = part(d, o0 + ob, p, v0)
            lo1, hi1 = part(d, o1 + ob, p, v1)
            lo2, hi2 = part(d, o2 + ob, p, v2)
            lo3, hi3 = part(d, o3 + ob, p, v3)
            a00, a10 = _fma32(lo0, hi0, x, j0 + e, a00), _fma32(lo1, hi1, x, j0 + e, a10)
            a20, a30 = _fma32(lo2, hi2, x, j0 + e, a20), _fma32(lo3, hi3, x, j0 + e, a30)
            a01, a11 = _fma32(lo0, hi0, x, j1 + e, a01), _fma32(lo1, hi1, x, j1 + e, a11)
            a21, a31 = _fma32(lo2, hi2, x, j1 + e, a21), _fma32(lo3, hi3, x, j1 + e, a31)
            if jn > 2:
                a02, a12 = _fma32(lo0, hi0, x, j2 + e, a02), _fma32(lo1, hi1, x, j2 + e, a12)
                a22, a32 = _fma32(lo2, hi2, x, j2 + e, a22), _fma32(lo3, hi3, x, j2 + e, a32)
            if jn > 3:
                a03, a13 = _fma32(lo0, hi0, x, j3 + e, a03), _fma32(lo1, hi1, x, j3 + e, a13)
                a23, a33 = _fma32(lo2, hi2, x, j3 + e, a23), _fma32(lo3, hi3, x, j3 + e, a33)
    return vsum16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33)


@njit(inline="always", cache=True)
def _dot2x8_of(part, scales, per_block, parts, nbytes, a):
    """Lane 8i + q = row at o_i . token at element j + q*kp of x (i < 2, q < jn, 5 <= jn <= 8):
    each part of the 2 rows decoded once for the jn tokens   a = (d, o0, o1, x, j, jn, kp)"""
    d, o0, o1, x, j, jn, kp = a
    z = vzero()
    a00 = a01 = a02 = a03 = a04 = a05 = a06 = a07 = z
    a10 = a11 = a12 = a13 = a14 = a15 = a16 = a17 = z
    for b in range(kp // per_block):
        ob = nbytes * b
        v0, v1 = scales(d, o0 + ob), scales(d, o1 + ob)
        for p in range(parts):
            e = j + per_block * b + 32 * p
            lo0, hi0 = part(d, o0 + ob, p, v0)
            lo1, hi1 = part(d, o1 + ob, p, v1)
            a00, a10 = _fma32(lo0, hi0, x, e, a00), _fma32(lo1, hi1, x, e, a10)
            a01, a11 = _fma32(lo0, hi0, x, e + kp, a01), _fma32(lo1, hi1, x, e + kp, a11)
            a02, a12 = _fma32(lo0, hi0, x, e + 2 * kp, a02), _fma32(lo1, hi1, x, e + 2 * kp, a12)
            a03, a13 = _fma32(lo0, hi0, x, e + 3 * kp, a03), _fma32(lo1, hi1, x, e + 3 * kp, a13)
            a04, a14 = _fma32(lo0, hi0, x, e + 4 * kp, a04), _fma32(lo1, hi1, x, e + 4 * kp, a14)
            if jn > 5:
                a05 = _fma32(lo0, hi0, x, e + 5 * kp, a05)
                a15 = _fma32(lo1, hi1, x, e + 5 * kp, a15)
            if jn > 6:
                a06 = _fma32(lo0, hi0, x, e + 6 * kp, a06)
                a16 = _fma32(lo1, hi1, x, e + 6 * kp, a16)
            if jn > 7:
                a07 = _fma32(lo0, hi0, x, e + 7 * kp, a07)
                a17 = _fma32(lo1, hi1, x, e + 7 * kp, a17)
    return vsum16(a00, a01, a02, a03, a04, a05, a06, a07, a10, a11, a12, a13, a14, a15, a16, a17)


def _verify_tile(t, n):
    """The verify tile for block type t and n tokens (2, 5..8; 0: 3 or 4, the count in a):
    _dot4xg_of(a) for n <= 4, else _dot2x8_of(a). t and n are constants of the closure, so
    numba drops the other branches before it inlines the tile, and the count's tests fold
    away. The decoders are `_typed`'s, written out again: numba inlines a decoder only where a
    call names it."""

    @njit(inline="always", cache=True)
    def tile(a):
        a = a[:-2] + (n, a[-1]) if n else a  # a = (..., count, kp)
        if n <= 4:
            if t == Q4_1:
                return _dot4xg_of(part_q4_1, no_scales, 32, 1, 20, a)
            if t == Q8_0:
                return _dot4xg_of(part_q8_0, no_scales, 32, 1, 34, a)
            if t == Q4_K:
                return _dot4xg_of(part_q4_k, scales_k, 256, 8, 144, a)
            if t == Q6_K:
                return _dot4xg_of(part_q6_k, scales_q6_k, 256, 8, 210, a)
            if t == Q5_K:
                return _dot4xg_of(part_q5_k, scales_k, 256, 8, 176, a)
            if t == Q4_0:
                return _dot4xg_of(part_q4_0, no_scales, 32, 1, 18, a)
            if t == Q5_0:
                return _dot4xg_of(part_q5_0, no_scales, 32, 1, 22, a)
            if t == Q5_1:
                return _dot4xg_of(part_q5_1, no_scales, 32, 1, 24, a)
            if t == F16:
                return _dot4xg_of(part_f16, no_scales, 32, 1, 64, a)
            if t == BF16:
                return _dot4xg_of(part_bf16, no_scales, 32, 1, 64, a)
            return _dot4xg_of(part_f32, no_scales, 32, 1, 128, a)
        if t == Q4_1:
            return _dot2x8_of(part_q4_1, no_scales, 32, 1, 20, a)
        if t == Q8_0:
            return _dot2x8_of(part_q8_0, no_scales, 32, 1, 34, a)
        if t == Q4_K:
            return _dot2x8_of(part_q4_k, scales_k, 256, 8, 144, a)
        if t == Q6_K:
            return _dot2x8_of(part_q6_k, scales_q6_k, 256, 8, 210, a)
        if t == Q5_K:
            return _dot2x8_of(part_q5_k, scales_k, 256, 8, 176, a)
        if t == Q4_0:
            return _dot2x8_of(part_q4_0, no_scales, 32, 1, 18, a)
        if t == Q5_0:
            return _dot2x8_of(part_q5_0, no_scales, 32, 1, 22, a)
        if t == Q5_1:
            return _dot2x8_of(part_q5_1, no_scales, 32, 1, 24, a)
        if t == F16:
            return _dot2x8_of(part_f16, no_scales, 32, 1, 64, a)
        if t == BF16:
            return _dot2x8_of(part_bf16, no_scales, 32, 1, 64, a)
        return _dot2x8_of(part_f32, no_scales, 32, 1, 128, a)

    return tile


@njit(inline="always", cache=True)
def _put(s, out, j, r0, rows, toks, lanes):
    """out[j + q, r0 + i] = lane lanes*i + q of s, for i < rows, q < toks"""
    for i in range(rows):
        for q in range(toks):
            out[j + q, r0 + i] = vlane(s, lanes * i + q)


def _verify_unit(t):
    """`_few_unit` for units of block type t: its six tiles inlined, one call per unit."""
    tile2, tile34, tile5, tile6, tile7, tile8 = (_verify_tile(t, n) for n in (2, 0, 5, 6, 7, 8))
    own = spec_of([t], few=False)  # a single token's dot, of this type only

    @njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
    def unit_of(a):
        d, unit, x, t0, t1, out = a
        r0, n, o, stride = unit[0], unit[1], unit[3], unit[4]
        o0, o1, o2, o3 = _row_offsets(o, stride, n)
        kp = x.shape[1]
        xf = x.reshape(-1)
        j = t0
        while j < t1:
            jn, e = min(8, t1 - j), j * kp
            if jn == 1:
                _put(_dot4(unit[2], d, o0, o1, o2, o3, x[j], kp, own), out, j, r0, n, 1, 1)
            elif jn == 2:
                s = tile2((d, o0, o1, o2, o3, xf, e, e + kp, e, e, 2, kp))
                _put(s, out, j, r0, n, 2, 4)
            elif jn <= 4:
                s = tile34((d, o0, o1, o2, o3, xf, e, e + kp, e + 2 * kp, e + 3 * kp, jn, kp))
                _put(s, out, j, r0, n, jn, 4)
            else:
                for i0 in range(0, n, 2):
                    a2 = (d, o0, o1, xf, e, jn, kp) if i0 == 0 else (d, o2, o3, xf, e, jn, kp)
                    if jn == 5:
                        s = tile5(a2)
                    elif jn == 6:
                        s = tile6(a2)
                    elif jn == 7:
                        s = tile7(a2)
                    else:
                        s = tile8(a2)
                    _put(s, out, j, r0 + i0, min(2, n - i0), jn, 8)
            j += jn

    return unit_of


_VERIFY = tuple(_verify_unit(t) for t in ORDER)  # each compiled when a spec names its type


def _on_type(t, a, spec):
    """The verify unit of block type t on a, for the types the spec names"""
    raise NotImplementedError("compiled code only")


@overload(_on_type, inline="always")
def _on_type_for(t, a, spec):
    q41, q80, q4k, q6k, q5k, q40, q50, q51, f16, bf16, f32 = _types_on(spec)
    u41, u80, u4k, u6k, u5k, u40, u50, u51, u16, ub16, u32 = _VERIFY

    def on_type(t, a, spec):
        if q41 and t == Q4_1:
            u41(a)
        elif q80 and t == Q8_0:
            u80(a)
        elif q4k and t == Q4_K:
            u4k(a)
        elif q6k and t == Q6_K:
            u6k(a)
        elif q5k and t == Q5_K:
            u5k(a)
        elif q40 and t == Q4_0:
            u40(a)
        elif q50 and t == Q5_0:
            u50(a)
        elif q51 and t == Q5_1:
            u51(a)
        elif f16 and t == F16:
            u16(a)
        elif bf16 and t == BF16:
            ub16(a)
        elif f32:
            u32(a)

    return on_type


@njit(inline="always", cache=True)
def _few_unit(d, unit, x, t0, t1, out, spec):
    """out[t, r0 + i] = row i . x[t] for t0 <= t < t1, in groups of <= 8 tokens   x [L, Kp]"""
    _on_type(unit[2], (d, unit, x, t0, t1, out), spec)


# ---------------------------------------------------------------- many tokens: decode once, tile


@njit(inline="always", cache=True)
def _to_f32_of(part, scales, per_block, parts, nbytes, a):
    d, o, kp, out, oo = a
    for b in range(kp // per_block):
        v = scales(d, o + nbytes * b)
        for p in range(parts):
            lo, hi = part(d, o + nbytes * b, p, v)
            e = oo + per_block * b + 32 * p
            vstore(out, e, lo)
            vstore(out, e + 16, hi)


_to_f32_typed = _typed(_to_f32_of)


@njit(cache=True)
def rows_to_f32(t, d, o, kp, out, oo, spec):
    """out[oo : oo+kp] = the row at byte o of d, decoded (gguf's floats, zero padding)"""
    _to_f32_typed(t, (d, o, kp, out, oo), spec)


@njit(cache=True)
def _decode_rows(t, d, o, stride, n, kp, out, spec):
    for i in range(n):
        rows_to_f32(t, d, o + i * stride, kp, out.reshape(-1), i * kp, spec)


def decode_rows(t, d, o, stride, n, kp, out) -> None:
    """out [n, kp] = the n rows at o, o+stride, ... decoded (whole tensors, for references;
    compiled once per block type)"""
    _decode_rows(t, d, o, stride, n, kp, out, spec_of([int(t)], few=False))


@njit(inline="always", cache=True)
def _tile(w, kp, x, xo, jn):
    """Rows w[i*kp:] (i < 4) . tokens x[xo + j*kp:] (j < jn <= 4): lane 4i + j"""
    z = vzero()
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = z
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = z
    if jn == 4:
        for c in range(0, kp, 16):
            x0, x1 = vload(x, xo + c), vload(x, xo + kp + c)
            x2, x3 = vload(x, xo + 2 * kp + c), vload(x, xo + 3 * kp + c)
            w0 = vload(w, c)
            a00, a01 = vfma(w0, x0, a00), vfma(w0, x1, a01)
            a02, a03 = vfma(w0, x2, a02), vfma(w0, x3, a03)
            w1 = vload(w, kp + c)
            a10, a11 = vfma(w1, x0, a10), vfma(w1, x1, a11)
            a12, a13 = vfma(w1, x2, a12), vfma(w1, x3, a13)
            w2 = vload(w, 2 * kp + c)
            a20, a21 = vfma(w2, x0, a20), vfma(w2, x1, a21)
            a22, a23 = vfma(w2, x2, a22), vfma(w2, x3, a23)
            w3 = vload(w, 3 * kp + c)
            a30, a31 = vfma(w3, x0, a30), vfma(w3, x1, a31)
            a32, a33 = vfma(w3, x2, a32), vfma(w3, x3, a33)
    elif jn == 3:
        for c in range(0, kp, 16):
            x0, x1, x2 = vload(x, xo + c), vload(x, xo + kp + c), vload(x, xo + 2 * kp + c)
            w0, w1 = vload(w, c), vload(w, kp + c)
            a00, a01, a02 = vfma(w0, x0, a00), vfma(w0, x1, a01), vfma(w0, x2, a02)
            a10, a11, a12 = vfma(w1, x0, a10), vfma(w1, x1, a11), vfma(w1, x2, a12)
            w2, w3 = vload(w, 2 * kp + c), vload(w, 3 * kp + c)
            a20, a21, a22 = vfma(w2, x0, a20), vfma(w2, x1, a21), vfma(w2, x2, a22)
            a30, a31, a32 = vfma(w3, x0, a30), vfma(w3, x1, a31), vfma(w3, x2, a32)
    elif jn == 2:
        for c in range(0, kp, 16):
            x0, x1 = vload(x, xo + c), vload(x, xo + kp + c)
            w0, w1 = vload(w, c), vload(w, kp + c)
            w2, w3 = vload(w, 2 * kp + c), vload(w, 3 * kp + c)
            a00, a01 = vfma(w0, x0, a00), vfma(w0, x1, a01)
            a10, a11 = vfma(w1, x0, a10), vfma(w1, x1, a11)
            a20, a21 = vfma(w2, x0, a20), vfma(w2, x1, a21)
            a30, a31 = vfma(w3, x0, a30), vfma(w3, x1, a31)
    else:
        for c in range(0, kp, 16):
            x0 = vload(x, xo + c)
            a00, a10 = vfma(vload(w, c), x0, a00), vfma(vload(w, kp + c), x0, a10)
            a20, a30 = vfma(vload(w, 2 * kp + c), x0, a20), vfma(vload(w, 3 * kp + c), x0, a30)
    return vsum16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33)


@njit(cache=True)
def _tiles_unit(d, unit, x, t0, t1, out, w, spec):
    """out[t, r0 + i] = row i . x[t] for t0 <= t < t1   x [L, Kp], w [4*Kp] scratch"""
    r0, n, t, o, stride = unit[0], unit[1], unit[2], unit[3], unit[4]
    kp = x.shape[1]
    for i in range(n):
        rows_to_f32(t, d, o + i * stride, kp, w, i * kp, spec)
    xf = x.reshape(-1)
    j = t0
    while j < t1:
        jn = min(4, t1 - j)
        s = _tile(w, kp, xf, j * kp, jn)
        for i in range(n):
            for q in range(jn):
                out[j + q, r0 + i] = vlane(s, 4 * i + q)
        j += jn


def _units(d, units, u0, u1, x, t0, t1, out, w, spec):
    """Units u0..u1-1 in one compiled loop (no call per unit when decoding)   w [4*Kp] scratch;
    1 < L <= FEW tokens take the verify tiles when the spec has them, else the prefill tiles"""
    raise NotImplementedError("compiled code only")


@overload(_units, inline="always")
def _units_for(d, units, u0, u1, x, t0, t1, out, w, spec):
    if not spec_on(spec, FEW_AT):
        def units_two(d, units, u0, u1, x, t0, t1, out, w, spec):
            if x.shape[0] == 1:
                for u in range(u0, u1):
                    _decode_unit(d, units[u], x[0], out[0], spec)
            else:
                for u in range(u0, u1):
                    _tiles_unit(d, units[u], x, t0, t1, out, w, spec)

        return units_two

    def units_three(d, units, u0, u1, x, t0, t1, out, w, spec):
        if x.shape[0] == 1:
            for u in range(u0, u1):
                _decode_unit(d, units[u], x[0], out[0], spec)
        elif x.shape[0] <= FEW:
            for u in range(u0, u1):
                _few_unit(d, units[u], x, t0, t1, out, spec)
        else:
            for u in range(u0, u1):
                _tiles_unit(d, units[u], x, t0, t1, out, w, spec)

    return units_three


# ---------------------------------------------------------------- parallel drivers
# One parallel function serves the three matmul kinds, so the type dispatch above is compiled
# into one parallel region (numba re-optimizes callees inside every caller).

PLAIN, ADD, GATE_UP = 0, 1, 2  # passed as np.int64: numba would compile _run for each literal
CHUNKS = 16  # contiguous runs of units per call, each with its own L1 scratch when L > 1


@njit(cache=True)
def _padded(x):
    """x [L, K] -> [L, Kp], Kp = K rounded up to 32 (float rows are stored padded alike)"""
    kp = -(-x.shape[1] // 32) * 32
    if kp == x.shape[1]:
        return x
    out = np.zeros((x.shape[0], kp), np.float32)
    for j in range(x.shape[0]):  # loops, not a slice assignment: numba compiles the latter's
        for i in range(x.shape[1]):  # shape-mismatch error text (string code) for seconds
            out[j, i] = x[j, i]
    return out


@njit(cache=True)
def _silu(g):
    return g / (ONE + np.exp(-g))


@njit(cache=True)
def _epilogue(kind, units, u0, u1, t0, t1, out, dest):
    """On the rows of units u0..u1-1, ADD: dest += out; GATE_UP: dest = silu(gate) * up"""
    n_ff = dest.shape[1]
    for u in range(u0, u1):
        r0, n = units[u, 0], units[u, 1]
        for j in range(t0, t1):
            for r in range(r0, r0 + n):
                if kind == ADD:
                    dest[j, r] += out[j, r]
                elif kind == GATE_UP:
                    dest[j, r] = _silu(out[j, r]) * out[j, n_ff + r]


def _any_units(d, units, u0, u1, x, xs8, xs16, t0, t1, out, w, spec):
    """Units u0..u1-1 of any numeric path: the exact one's (x), or an integer path's (x
    quantized as xs8 or xs16, `_activations`'s)"""
    raise NotImplementedError("compiled code only")


@njit(inline="always", cache=True)
def _int8_units(d, units, u0, u1, xs, t0, t1, out):
    if out.shape[0] == 1:
        int8.units_one_token(d, units, u0, u1, xs, out[0])
    else:
        int8.units_tokens(d, units, u0, u1, xs, t0, t1, out)


@njit(inline="always", cache=True)
def _int16_units(d, units, u0, u1, xs, t0, t1, out):
    if out.shape[0] == 1:
        int16.units_one_token(d, units, u0, u1, xs, t0, out)  # t0 = 0: not the literal 0, a
        # signature of its own (a second compile of the tile)
    else:
        int16.units_tokens(d, units, u0, u1, xs, t0, t1, out)


@overload(_any_units, inline="always")
def _any_units_for(d, units, u0, u1, x, xs8, xs16, t0, t1, out, w, spec):
    i8, i16 = spec_on(spec, INT8_AT), spec_on(spec, INT16_AT)
    if not i8 and not i16:
        def exact_units(d, units, u0, u1, x, xs8, xs16, t0, t1, out, w, spec):
            _units(d, units, u0, u1, x, t0, t1, out, w, spec)

        return exact_units
    if not i16:
        def int8_units(d, units, u0, u1, x, xs8, xs16, t0, t1, out, w, spec):
            if units[u0, 2] < int8.Q4_1X:
                _units(d, units, u0, u1, x, t0, t1, out, w, spec)
            else:
                _int8_units(d, units, u0, u1, xs8, t0, t1, out)

        return int8_units
    if not i8:
        def int16_units(d, units, u0, u1, x, xs8, xs16, t0, t1, out, w, spec):
            if units[u0, 2] < int8.Q4_1X:
                _units(d, units, u0, u1, x, t0, t1, out, w, spec)
            else:
                _int16_units(d, units, u0, u1, xs16, t0, t1, out)

        return int16_units

    def any_units(d, units, u0, u1, x, xs8, xs16, t0, t1, out, w, spec):
        if units[u0, 2] < int8.Q4_1X:
            _units(d, units, u0, u1, x, t0, t1, out, w, spec)
        elif units[u0, 2] < int16.Q4_1W:
            _int8_units(d, units, u0, u1, xs8, t0, t1, out)
        else:
            _int16_units(d, units, u0, u1, xs16, t0, t1, out)

    return any_units


@njit(parallel=True, cache=True)
def _parallel(kind, x, xs8, xs16, d, units, t0, t1, out, dest, scratch, spec, prof):
    """Run c of the units (and for GATE_UP its up units), then the epilogue over the run
    scratch [chunks, 4*Kp]: run c's L1 scratch ([chunks, 0] when decoding or on an integer path);
    prof: `clock`'s (each chunk stamps its start and end)"""
    n = units.shape[0] // 2 if kind == GATE_UP else units.shape[0]
    chunks = scratch.shape[0]
    for c in prange(chunks):
        i = np.int64(c)  # prange indices may be unsigned: keep the callees' signatures int64
        clock.chunk_start(prof, i)
        u0, u1 = i * n // chunks, (i + 1) * n // chunks
        _any_units(d, units, u0, u1, x, xs8, xs16, t0, t1, out, scratch[i], spec)
        if kind == GATE_UP:
            _any_units(d, units, n + u0, n + u1, x, xs8, xs16, t0, t1, out, scratch[i], spec)
        _epilogue(kind, units, u0, u1, t0, t1, out, dest)
        clock.chunk_end(prof, i)


def _activations(x, code, spec):
    """(int8's, int16's) quantized activations of x, each of x's rows for a matrix of block type
    `code` on that path, else of none (0 when the spec has no such path)"""
    raise NotImplementedError("compiled code only")


@overload(_activations, inline="always")
def _activations_for(x, code, spec):
    i8, i16 = spec_on(spec, INT8_AT), spec_on(spec, INT16_AT)
    if not i8 and not i16:
        return lambda x, code, spec: (0, 0)
    if not i16:
        return lambda x, code, spec: (int8.quantize(x if code >= int8.Q4_1X else x[:0]), 0)
    if not i8:
        return lambda x, code, spec: (0, int16.quantize(x if code >= int8.Q4_1X else x[:0]))
    return lambda x, code, spec: (
        int8.quantize(x if int8.Q4_1X <= code < int16.Q4_1W else x[:0]),
        int16.quantize(x if code >= int16.Q4_1W else x[:0]))


def _few_max(spec):
    """FEW when the spec has the verify tiles, else 1 (more tokens: the prefill tiles)"""
    raise NotImplementedError("compiled code only")


@overload(_few_max, inline="always")
def _few_max_for(spec):
    few = FEW if spec_on(spec, FEW_AT) else 1
    return lambda spec: few


@njit(cache=True)
def _run(kind, x, w, out, dest, spec, prof):
    x = _padded(x)
    n = w[1].shape[0] // 2 if kind == GATE_UP else w[1].shape[0]
    exact = w[1][0, 2] < int8.Q4_1X  # else a matrix of an integer path (all its units are)
    xs8, xs16 = _activations(x, w[1][0, 2], spec)
    tile = exact and x.shape[0] > _few_max(spec)
    scratch = np.empty((min(n, CHUNKS), R * x.shape[1] if tile else 0), np.float32)
    for t0 in range(0, x.shape[0], TB):
        _parallel(kind, x, xs8, xs16, w[0], w[1], t0, min(x.shape[0], t0 + TB), out, dest,
                  scratch, spec, prof)
        clock.region_done(prof, scratch.shape[0])


@njit(inline="always", cache=True)
def _call(kind, x, w, out, dest, spec, prof):
    """_run with prof = None as "not profiled" (a zero-length stamp array)"""
    if prof is None:
        _run(np.int64(kind), x, w, out, dest, spec, np.zeros(0, np.int64))
    else:
        _run(np.int64(kind), x, w, out, dest, spec, prof)


def compile_run(x, w, out, spec, prof) -> None:
    """Compile (or load from numba's cache) the function every product of a kernel with these
    argument types calls (matmul, matmul_add and gate_up_silu all run `_run`), by running out =
    x @ w.T once: a process of its own can then fill the cache while another compiles the rest
    (kernel.compile_half)."""
    _run(np.int64(PLAIN), x, w, out, out, spec, prof)


@njit(inline="always", cache=True)
def matmul(x, w, out, spec, prof=None):
    """out = x @ w.T   x [L, K], w = (data, units) of [N, K] -> out [L, N]"""
    _call(PLAIN, x, w, out, out, spec, prof)


@njit(inline="always", cache=True)
def matmul_add(x, w, tmp, h, spec, prof=None):
    """h += x @ w.T (the residual add fused in)   x [L, K], w [D, K], tmp/h [L, D]"""
    _call(ADD, x, w, tmp, h, spec, prof)


@njit(inline="always", cache=True)
def gate_up_silu(x, w, gu, act, spec, prof=None):
    """act = silu(x @ gate.T) * (x @ up.T)
    x [L, D], w [2F, D] units of gate then of up, gu [L, 2F] scratch -> act [L, F]"""
    _call(GATE_UP, x, w, gu, act, spec, prof)


@njit(cache=True)
def n_rows(w):
    """N of a matrix w = (data, units)"""
    u = w[1]
    return u[u.shape[0] - 1, 0] + u[u.shape[0] - 1, 1]


@njit(cache=True)
def embed_rows(w, tokens, h, spec):
    """h[j] = row tokens[j] of w, decoded   tokens [L], h [L, D]"""
    d, units = w
    kp = -(-h.shape[1] // 32) * 32
    row = np.empty(kp, np.float32)
    for j in range(tokens.shape[0]):
        u = np.searchsorted(units[:, 0], tokens[j], side="right") - 1
        o = units[u, 3] + (tokens[j] - units[u, 0]) * units[u, 4]
        rows_to_f32(units[u, 2], d, o, kp, row, 0, spec)
        for i in range(h.shape[1]):  # a loop: see _padded
            h[j, i] = row[i]
