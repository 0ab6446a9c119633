"""Explicit 16-lane vectors for numba, so a dot product's summation order is written in the code.

Each op is one LLVM instruction (or a fixed sequence) on <16 x float> / <16 x i32> with no
fast-math flags: LLVM may neither re-associate nor contract them, so results never depend on
the auto-vectorizer's choices. A dot product is 16 lanes, lane l a chain of fused multiply-adds
over k = l, l+16, l+32, ..., closed by the fixed tree of `vsum` — the one summation order every
matmul tile uses. Vectors live only inside compiled code (no boxing to Python).

`vperm`/`vperm2` are AVX-512 instructions; callers check `LUT` and compute the same floats
arithmetically on other CPUs. Everything else is portable LLVM IR.
"""

import os

import llvmlite.ir as ir
from numba import types
from numba.core import cgutils, codegen, config
from numba.extending import intrinsic, models, register_model


def target_features() -> set[str]:
    """The CPU features numba compiles for: NUMBA_CPU_FEATURES when set, else the host's (without
    AVX when NUMBA_ENABLE_AVX=0), as numba's JIT target machine takes them. Only features the
    string enables count: with NUMBA_CPU_NAME and a NUMBA_CPU_FEATURES that leaves a feature to
    the CPU model, kolibri does without it (portable code, the same bits, maybe slower) rather
    than emit an instruction the target may lack."""
    features = config.CPU_FEATURES
    if features is None:
        features = codegen.get_host_cpu_features()
    enabled = set()
    for f in filter(None, features.split(",")):  # "+name" or "-name", the last one wins
        (enabled.add if f[0] == "+" else enabled.discard)(f[1:])
    return enabled


def _uses(*features: str) -> bool:
    """Whether kolibri emits instructions needing these features (KOLIBRI_SIMD=portable: never)"""
    return set(features) <= target_features() and os.environ.get("KOLIBRI_SIMD") != "portable"


N = 16  # lanes
# Table lookups in one instruction (vpermps). Without AVX-512 in numba's target (another CPU,
# NUMBA_CPU_NAME/NUMBA_CPU_FEATURES, or KOLIBRI_SIMD=portable) the same floats are computed
# arithmetically (tests run both).
LUT = _uses("avx512f")


class _F32x16(types.Type):
    def __init__(self):
        super().__init__(name="f32x16")


class _I32x16(types.Type):
    def __init__(self):
        super().__init__(name="i32x16")


f32x16, i32x16 = _F32x16(), _I32x16()
_VF = ir.VectorType(ir.FloatType(), N)
_VI = ir.VectorType(ir.IntType(32), N)
_I32 = ir.IntType(32)


@register_model(_F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


@register_model(_I32x16)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI)


def _ptr(context, builder, arrty, arr, i, elty):
    """Pointer to element i of the flat C-contiguous array arr, cast to elty*"""
    data = cgutils.create_struct_proxy(arrty)(context, builder, value=arr).data
    return builder.bitcast(builder.gep(data, [i]), elty.as_pointer())


def _splat(builder, x, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_VI, [0] * N))


def _call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


# ---------------------------------------------------------------- loads and stores


def _loader(vt, elty, widen, doc):
    """An intrinsic loading N elements of elty at element i of a flat array, widened to vt."""

    @intrinsic
    def load(typingctx, arr, i):
        sig = (f32x16 if vt is _VF else i32x16)(arr, types.intp)

        def codegen(context, builder, signature, args):
            v = builder.load(_ptr(context, builder, arr, args[0], args[1],
                                  ir.VectorType(elty, N)), align=1)
            return widen(builder, v)

        return sig, codegen

    load.__doc__ = doc
    return load


vload = _loader(_VF, ir.FloatType(), lambda b, v: v,
               "16 float32 at element i of a float32 array (at byte i of a uint8 array)")


@intrinsic
def vload_row(typingctx, arr, i):
    """arr[i : i+16] of a 1-D float32 array of any layout (a strided one element by element)"""
    sig = f32x16(arr, types.intp)

    def codegen(context, builder, signature, args):
        if arr.layout in "CF":
            return builder.load(_ptr(context, builder, arr, args[0], args[1], _VF), align=1)
        ary = context.make_array(arr)(context, builder, args[0])
        v = ir.Constant(_VF, ir.Undefined)
        for k in range(N):
            p = cgutils.get_item_pointer(context, builder, arr, ary,
                                         [builder.add(args[1], ir.Constant(args[1].type, k))])
            v = builder.insert_element(v, builder.load(p), ir.Constant(_I32, k))
        return v

    return sig, codegen
vload_f16 = _loader(_VF, ir.HalfType(), lambda b, v: b.fpext(v, _VF),
                    "16 float16 at byte i of a uint8 array, widened (exact)")
vload_bf16 = _loader(
    _VF, ir.IntType(16),
    lambda b, v: b.bitcast(b.shl(b.zext(v, _VI), ir.Constant(_VI, [16] * N)), _VF),
    "16 bfloat16 at byte i of a uint8 array, widened (exact: the high half of a float32)")
vload_u8 = _loader(_VI, ir.IntType(8), lambda b, v: b.zext(v, _VI),
                   "16 bytes at byte i of a uint8 array, zero-extended")
vload_i8 = _loader(_VI, ir.IntType(8), lambda b, v: b.sext(v, _VI),
                   "16 bytes at byte i of a uint8 array, sign-extended")


def _scalar(elty, result, convert, doc):
    @intrinsic
    def load(typingctx, arr, i):
        sig = result(arr, types.intp)

        def codegen(context, builder, signature, args):
            return convert(builder, builder.load(_ptr(context, builder, arr, args[0], args[1],
                                                      elty), align=1))

        return sig, codegen

    load.__doc__ = doc
    return load


f16 = _scalar(ir.HalfType(), types.float32, lambda b, v: b.fpext(v, ir.FloatType()),
              "the float16 at byte i of a uint8 array, as float32 (exact)")
f32 = _scalar(ir.FloatType(), types.float32, lambda b, v: v,
              "the float32 at byte i of a uint8 array")
i8 = _scalar(ir.IntType(8), types.int32, lambda b, v: b.sext(v, _I32),
             "the int8 at byte i of a uint8 array, as int32")
u32 = _scalar(_I32, types.int32, lambda b, v: v,
              "the little-endian 32-bit word at byte i of a uint8 array")


def _storer(vtype, vt, doc):
    @intrinsic
    def store(typingctx, arr, i, v):
        sig = types.void(arr, types.intp, vtype)

        def codegen(context, builder, signature, args):
            builder.store(args[2], _ptr(context, builder, arr, args[0], args[1], vt), align=4)

        return sig, codegen

    store.__doc__ = doc
    return store


vstore = _storer(f32x16, _VF, "arr[i : i+16] = v (a float32 array)")
vstore_i32 = _storer(i32x16, _VI, "arr[i : i+16] = v (an int32 array)")


# ---------------------------------------------------------------- constants and broadcasts


def _constant(vt, values, doc):
    @intrinsic
    def const(typingctx):
        sig = (f32x16 if vt is _VF else i32x16)()
        return sig, lambda context, builder, signature, args: ir.Constant(vt, values)

    const.__doc__ = doc
    return const


vzero = _constant(_VF, [0.0] * N, "16 x +0.0")
vsum_start = _constant(_VF, [0.0] + [-0.0] * (N - 1),
                       "[+0.0, -0.0, ..., -0.0]: the lanes LLVM's vectorizer starts a sum of +0 in")
viota = _constant(_VF, [float(i) for i in range(N)], "[0.0, 1.0, ..., 15.0]")
viota16 = _constant(_VF, [float(i) for i in range(N, 2 * N)], "[16.0, 17.0, ..., 31.0]")
vlanes = _constant(_VI, list(range(N)), "[0, 1, ..., 15] as int32")


@intrinsic
def vbcast(typingctx, x):
    """16 x the float32 x"""
    sig = f32x16(types.float32)
    return sig, lambda context, builder, signature, args: _splat(builder, args[0], _VF)


@intrinsic
def vibcast(typingctx, x):
    """16 x the int32 x"""
    sig = i32x16(types.int32)
    return sig, lambda context, builder, signature, args: _splat(builder, args[0], _VI)


# ---------------------------------------------------------------- arithmetic


@intrinsic
def vfma(typingctx, a, b, c):
    """a*b + c rounded once (IEEE fused multiply-add), lane by lane"""
    sig = f32x16(f32x16, f32x16, f32x16)
    return sig, lambda context, builder, signature, args: _call(builder, "llvm.fma.v16f32", _VF,
                                                                 list(args))


@intrinsic
def fma32(typingctx, a, b, c):
    """a*b + c rounded once, for float32 scalars"""
    sig = types.float32(types.float32, types.float32, types.float32)
    return sig, lambda context, builder, signature, args: _call(builder, "llvm.fma.f32",
                                                                 ir.FloatType(), list(args))


@intrinsic
def vmul(typingctx, a, b):
    sig = f32x16(f32x16, f32x16)
    return sig, lambda context, builder, signature, args: builder.fmul(args[0], args[1])


@intrinsic
def vcvt(typingctx, v):
    """int32 lanes -> float32 (exact below 2^24)"""
    sig = f32x16(i32x16)
    return sig, lambda context, builder, signature, args: builder.sitofp(args[0], _VF)


def _int_op(op, doc):
    @intrinsic
    def f(typingctx, a, b):
        sig = i32x16(i32x16, i32x16)
        return sig, lambda context, builder, signature, args: getattr(builder, op)(*args)

    f.__doc__ = doc
    return f


vor = _int_op("or_", "lane-wise a | b")
vand = _int_op("and_", "lane-wise a & b")
vsub = _int_op("sub", "lane-wise a - b (int32)")
vshr = _int_op("lshr", "lane-wise logical a >> b")
vshl = _int_op("shl", "lane-wise a << b")


@intrinsic
def vperm(typingctx, table, idx):
    """lane i -> table[idx[i] & 15] (AVX-512 vpermps; only where LUT)"""
    sig = f32x16(f32x16, i32x16)
    return sig, lambda context, builder, signature, args: _call(
        builder, "llvm.x86.avx512.permvar.sf.512", _VF, list(args))


@intrinsic
def vperm2(typingctx, lo, idx, hi):
    """lane i -> (lo ++ hi)[idx[i] & 31] (AVX-512 vpermi2ps; only where LUT)"""
    sig = f32x16(f32x16, i32x16, f32x16)
    return sig, lambda context, builder, signature, args: _call(
        builder, "llvm.x86.avx512.vpermi2var.ps.512", _VF, list(args))


# ---------------------------------------------------------------- the reduction tree


def _tree_sums(builder, vecs):
    """Lane i of the result = the tree sum of vecs[i] (up to 16 vectors): lanes j + j+8, then
    j + j+4, j + j+2, j + j+1 — the same adds for every vector, done for 16 of them at once by
    pairing halves of two vectors in each shuffle."""
    vecs = list(vecs) + [ir.Constant(_VF, [0.0] * N)] * (N - len(vecs))
    width = N  # lanes of each sum still to fold, per group
    while width > 1:
        half = width // 2
        lo = [g + i for g in range(0, 2 * N, width) for i in range(half)]
        hi = [g + half + i for g in range(0, 2 * N, width) for i in range(half)]
        vecs = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(_VI, lo)),
                             builder.shuffle_vector(a, b, ir.Constant(_VI, hi)))
                for a, b in zip(vecs[0::2], vecs[1::2], strict=True)]
        width = half
    return vecs[0]


@intrinsic
def vsum(typingctx, v):
    """The tree sum of one vector's 16 lanes (the closing step of every dot product)"""
    sig = types.float32(f32x16)

    def codegen(context, builder, signature, args):
        return builder.extract_element(_tree_sums(builder, [args[0]]), ir.Constant(_I32, 0))

    return sig, codegen


@intrinsic
def vsum16(typingctx, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    """lane i = vsum(a_i): sixteen tree sums in 15 adds"""
    sig = f32x16(*([f32x16] * N))
    return sig, lambda context, builder, signature, args: _tree_sums(builder, args)


@intrinsic
def vlane(typingctx, v, i):
    """lane i of v"""
    sig = types.float32(f32x16, types.intp)
    return sig, lambda context, builder, signature, args: builder.extract_element(*args)


# ---------------------------------------------------------------- K-quant helpers


@intrinsic
def k_scale_codes(typingctx, arr, i):
    """The 16 6-bit codes packed in the 12 bytes at byte i of a uint8 array (Q4_K/Q5_K): lanes
    0..7 the sub-block scales, 8..15 the mins, as gguf's Q4_K.get_scale_min unpacks them:
    scale s<4: b[s] & 63; s>=4: (b[s+4] & 15) | (b[s-4] >> 6) << 4
    min   s<4: b[s+4] & 63; s>=4: (b[s+4] >> 4) | (b[s] >> 6) << 4"""
    sig = i32x16(arr, types.intp)
    low_byte = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11]
    low_shift = [0] * 8 + [0, 0, 0, 0, 4, 4, 4, 4]
    low_mask = [63] * 4 + [15] * 4 + [63] * 4 + [15] * 4
    high_byte = [0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7]
    high_mask = [0] * 4 + [0x30] * 4 + [0] * 4 + [0x30] * 4

    def codegen(context, builder, signature, args):
        b = builder.load(_ptr(context, builder, arr, args[0], args[1],
                              ir.VectorType(ir.IntType(8), N)), align=1)
        b = builder.zext(b, _VI)
        c = lambda values: ir.Constant(_VI, values)  # noqa: E731
        low = builder.shuffle_vector(b, b, c(low_byte))
        low = builder.and_(builder.lshr(low, c(low_shift)), c(low_mask))
        high = builder.shuffle_vector(b, b, c(high_byte))
        high = builder.and_(builder.lshr(high, c([2] * N)), c(high_mask))
        return builder.or_(low, high)

    return sig, codegen


@intrinsic
def vhalves(typingctx, a, b):
    """lanes 0..7 of a, then lanes 8..15 of b"""
    sig = f32x16(f32x16, f32x16)

    def codegen(context, builder, signature, args):
        return builder.shuffle_vector(args[0], args[1],
                                      ir.Constant(_VI, list(range(8)) + list(range(24, 32))))

    return sig, codegen


@intrinsic
def vsplat(typingctx, v, i):
    """16 x lane i of v"""
    sig = f32x16(f32x16, types.intp)

    def codegen(context, builder, signature, args):
        return _splat(builder, builder.extract_element(args[0], args[1]), _VF)

    return sig, codegen


# ---------------------------------------------------------------- 64 bytes: integer dot products
# The int8 numeric path multiplies 64 unsigned weight bytes by 64 signed activation bytes and adds
# each group of 4 products into one int32 lane. Integers are exact, so the AVX-512 VNNI
# instruction and the portable widen-multiply-add sequence give the same lanes.

VNNI = _uses("avx512f", "avx512vnni")


class _I8x64(types.Type):
    def __init__(self):
        super().__init__(name="i8x64")


i8x64 = _I8x64()
_VB = ir.VectorType(ir.IntType(8), 4 * N)
_I64x32 = ir.VectorType(ir.IntType(32), 4 * N)


@register_model(_I8x64)
class _I8x64Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VB)


@intrinsic
def vload_b64(typingctx, arr, i):
    """64 bytes at byte i of a uint8 or int8 array"""
    sig = i8x64(arr, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_ptr(context, builder, arr, args[0], args[1], _VB), align=1)

    return sig, codegen


vload_i32 = _loader(_VI, _I32, lambda b, v: v, "16 int32 at element i of an int32 array")


@intrinsic
def vquads(typingctx, arr, i):
    """The 4 float32 at byte i of a uint8 array, each in 4 lanes: lanes 4j..4j+3 = float j"""
    sig = f32x16(arr, types.intp)
    spread = ir.Constant(ir.VectorType(_I32, N), [lane // 4 for lane in range(N)])

    def codegen(context, builder, signature, args):
        v = builder.load(_ptr(context, builder, arr, args[0], args[1],
                              ir.VectorType(ir.FloatType(), 4)), align=1)
        return builder.shuffle_vector(v, v, spread)

    return sig, codegen


def _head_mask(builder, n, lanes):
    """<lanes x i1>: lane i < n"""
    idx = ir.Constant(ir.VectorType(_I32, lanes), list(range(lanes)))
    v = builder.insert_element(ir.Constant(ir.VectorType(_I32, lanes), ir.Undefined),
                               builder.trunc(n, _I32), ir.Constant(_I32, 0))
    splat = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))
    return builder.icmp_unsigned("<", idx, splat)


def _masked_load(builder, ptr, vt, n, name):
    """The first n elements of vt at ptr, zeros after; only those n are read (a row's tail may
    end the buffer)"""
    return _call(builder, name, vt, [ptr, ir.Constant(_I32, 1), _head_mask(builder, n, vt.count),
                                     ir.Constant(vt, None)])


@intrinsic
def vload_b64_head(typingctx, arr, i, n):
    """The first n (<= 64, a multiple of 4) bytes at byte i of a uint8 array, then zero bytes up
    to 64 (loaded as 32-bit words: AVX2 masks those, vpmaskmovd; bytes it would load one by one)"""
    sig = i8x64(arr, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        p = _ptr(context, builder, arr, args[0], args[1], _VI)
        words = builder.lshr(args[2], ir.Constant(args[2].type, 2))
        return builder.bitcast(_masked_load(builder, p, _VI, words, "llvm.masked.load.v16i32.p0"),
                               _VB)

    return sig, codegen


@intrinsic
def vquads_head(typingctx, arr, i, n):
    """`vquads` of the first n (<= 4) float32 at byte i, zeros in the lanes of the others"""
    sig = f32x16(arr, types.intp, types.intp)
    v4 = ir.VectorType(ir.FloatType(), 4)
    spread = ir.Constant(_VI, [lane // 4 for lane in range(N)])

    def codegen(context, builder, signature, args):
        p = _ptr(context, builder, arr, args[0], args[1], v4)
        v = _masked_load(builder, p, v4, args[2], "llvm.masked.load.v4f32.p0")
        return builder.shuffle_vector(v, v, spread)

    return sig, codegen


def _byte_op(make, doc):
    @intrinsic
    def f(typingctx, v):
        sig = i8x64(i8x64)
        return sig, lambda context, builder, signature, args: make(builder, args[0])

    f.__doc__ = doc
    return f


vlow4 = _byte_op(lambda b, v: b.and_(v, ir.Constant(_VB, [15] * 4 * N)),
                 "the low nibble of each byte")
vhigh4 = _byte_op(lambda b, v: b.lshr(v, ir.Constant(_VB, [4] * 4 * N)),
                  "the high nibble of each byte")


@intrinsic
def vizero(typingctx):
    """16 x int32 0"""
    return i32x16(), lambda context, builder, signature, args: ir.Constant(_VI, [0] * N)


def _dpbusd_portable(builder, acc, a, b):
    prod = builder.mul(builder.zext(a, _I64x32), builder.sext(b, _I64x32))
    for k in range(4):
        acc = builder.add(acc, builder.shuffle_vector(
            prod, prod, ir.Constant(_VI, [4 * lane + k for lane in range(N)])))
    return acc


@intrinsic
def vdpbusd(typingctx, acc, a, b):
    """lane i = acc[i] + sum over bytes 4i..4i+3 of a (unsigned) * b (signed), exact
    (vpdpbusd where VNNI, else widened multiplies and adds: the same integers)"""
    sig = i32x16(i32x16, i8x64, i8x64)

    def codegen(context, builder, signature, args):
        if VNNI:
            return _call(builder, "llvm.x86.avx512.vpdpbusd.512", _VI, list(args))
        return _dpbusd_portable(builder, *args)

    return sig, codegen


@intrinsic
def vbytes(typingctx, b):
    """64 x the byte b (a constant)"""
    value = b.literal_value if isinstance(b, types.IntegerLiteral) else None
    if value is None:
        return None
    sig = i8x64(b)
    return sig, lambda context, builder, signature, args: ir.Constant(_VB, [value] * 4 * N)


# ---------------------------------------------------------------- quantizing activations


@intrinsic
def absmax32(typingctx, arr, i):
    """max |x| over the 32 float32 at element i of a float32 array (exact: max is exact)"""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        p = _ptr(context, builder, arr, args[0], args[1], _VF)
        a = builder.load(p, align=4)
        b = builder.load(builder.gep(p, [ir.Constant(_I32, 1)]), align=4)
        fabs = lambda v: _call(builder, "llvm.fabs.v16f32", _VF, [v])  # noqa: E731
        m = _call(builder, "llvm.maxnum.v16f32", _VF, [fabs(a), fabs(b)])
        return _call(builder, "llvm.vector.reduce.fmax.v16f32", ir.FloatType(), [m])

    return sig, codegen


@intrinsic
def vround_store(typingctx, x, i, inv, q, j):
    """q[j : j+16] = rint(x[i : i+16] * inv) as int8 (|values| <= 127 by the caller's scale),
    returned as int32 lanes too (round half to even, the IEEE default)"""
    sig = i32x16(x, types.intp, types.float32, q, types.intp)

    def codegen(context, builder, signature, args):
        xs, i, inv, qs, j = args
        v = builder.load(_ptr(context, builder, x, xs, i, _VF), align=4)
        r = _call(builder, "llvm.rint.v16f32", _VF, [builder.fmul(v, _splat(builder, inv, _VF))])
        n = builder.fptosi(r, _VI)
        builder.store(builder.trunc(n, ir.VectorType(ir.IntType(8), N)),
                      _ptr(context, builder, q, qs, j, ir.VectorType(ir.IntType(8), N)), align=1)
        return n

    return sig, codegen


@intrinsic
def vhsum_i(typingctx, v):
    """the sum of v's 16 int32 lanes (exact)"""
    sig = types.int32(i32x16)
    return sig, lambda context, builder, signature, args: _call(
        builder, "llvm.vector.reduce.add.v16i32", _I32, [args[0]])


@intrinsic
def vadd_i(typingctx, a, b):
    sig = i32x16(i32x16, i32x16)
    return sig, lambda context, builder, signature, args: builder.add(*args)
