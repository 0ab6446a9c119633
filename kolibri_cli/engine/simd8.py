"""256-bit vectors for the int16 numeric path: 16 x int16, 8 x int32, 8 x float32.

Integer multiply-adds are exact, so how a CPU computes them does not change a bit: `vmadd16`
is AVX2's `vpmaddwd` where numba's target has AVX2 and the same integers from widened multiplies
elsewhere. The float ops carry no fast-math flags (LLVM may neither re-associate nor contract
them), so a sum's order is the one written. Portable LLVM IR otherwise; on AVX-512 hosts these
run on 256-bit registers.
"""

import llvmlite.ir as ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from kolibri_cli.engine.simd import _uses, target_features

AVX2 = _uses("avx2")
# the target runs AVX2 code, whatever KOLIBRI_SIMD forces: where int16 is the default path
# (engine.weights.default_numerics), so a forced portable build runs the same numeric path
TARGET_AVX2 = "avx2" in target_features()
# float16 scales widen with one instruction (F16C); LLVM's fallback is a runtime-library call
# numba's JIT does not link, so without F16C in the target the int16 path is refused
F16C = "f16c" in target_features()


class _I16x16(types.Type):
    def __init__(self):
        super().__init__(name="i16x16")


class _I32x8(types.Type):
    def __init__(self):
        super().__init__(name="i32x8")


class _F32x8(types.Type):
    def __init__(self):
        super().__init__(name="f32x8")


i16x16, i32x8, f32x8 = _I16x16(), _I32x8(), _F32x8()
_I16, _I32 = ir.IntType(16), ir.IntType(32)
_VW = ir.VectorType(_I16, 16)
_VI = ir.VectorType(_I32, 8)
_VF = ir.VectorType(ir.FloatType(), 8)
_VH = ir.VectorType(ir.HalfType(), 8)


for _t, _llvm in ((_I16x16, _VW), (_I32x8, _VI), (_F32x8, _VF)):
    def _model(llvm_type):
        class Model(models.PrimitiveModel):
            def __init__(self, dmm, fe_type):
                super().__init__(dmm, fe_type, llvm_type)
        return Model
    register_model(_t)(_model(_llvm))


def _ptr(context, builder, arrty, arr, i, elty):
    """Pointer to element i of the flat C-contiguous array arr, cast to elty*"""
    data = cgutils.create_struct_proxy(arrty)(context, builder, value=arr).data
    return builder.bitcast(builder.gep(data, [i]), elty.as_pointer())


def _call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _const(vt, values):
    return ir.Constant(vt, values)


# ---------------------------------------------------------------- loads


def _bytes16(builder, context, arrty, arr, i):
    return builder.load(_ptr(context, builder, arrty, arr, i, ir.VectorType(ir.IntType(8), 16)),
                        align=1)


@intrinsic
def wload_i8(typingctx, arr, i):
    """The 16 bytes at byte i of a uint8 array, sign-extended to 16 x int16"""
    sig = i16x16(arr, types.intp)

    def codegen(context, builder, signature, args):
        return builder.sext(_bytes16(builder, context, arr, args[0], args[1]), _VW)

    return sig, codegen


@intrinsic
def xload(typingctx, arr, i):
    """16 int16 at element i of an int16 array"""
    sig = i16x16(arr, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_ptr(context, builder, arr, args[0], args[1], _VW), align=2)

    return sig, codegen


@intrinsic
def fload(typingctx, arr, i):
    """8 float32 at element i of a float32 array"""
    sig = f32x8(arr, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_ptr(context, builder, arr, args[0], args[1], _VF), align=4)

    return sig, codegen


@intrinsic
def hload(typingctx, arr, i, n):
    """The first n (even, <= 8) float16 at byte i of a uint8 array, widened; zeros after
    (read as n/2 32-bit words, masked: a row's last scales may end the buffer)"""
    sig = f32x8(arr, types.intp, types.intp)
    v4 = ir.VectorType(_I32, 4)

    def codegen(context, builder, signature, args):
        p = _ptr(context, builder, arr, args[0], args[1], v4)
        words = builder.trunc(builder.lshr(args[2], ir.Constant(args[2].type, 1)), _I32)
        splat = builder.shuffle_vector(
            builder.insert_element(ir.Constant(v4, ir.Undefined), words, ir.Constant(_I32, 0)),
            ir.Constant(v4, ir.Undefined), ir.Constant(v4, [0] * 4))
        mask = builder.icmp_unsigned("<", ir.Constant(v4, [0, 1, 2, 3]), splat)
        w = _call(builder, "llvm.masked.load.v4i32.p0", v4,
                  [p, ir.Constant(_I32, 2), mask, ir.Constant(v4, None)])
        return builder.fpext(builder.bitcast(w, _VH), _VF)

    return sig, codegen


# ---------------------------------------------------------------- arithmetic


def _madd_portable(builder, a, b):
    w = ir.VectorType(_I32, 16)
    prod = builder.mul(builder.sext(a, w), builder.sext(b, w))
    even = builder.shuffle_vector(prod, prod, _const(_VI, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(prod, prod, _const(_VI, list(range(1, 16, 2))))
    return builder.add(even, odd)


@intrinsic
def vmadd16(typingctx, a, b):
    """lane i = a[2i]*b[2i] + a[2i+1]*b[2i+1] as int32, exact (no two products reach 2^31)"""
    sig = i32x8(i16x16, i16x16)

    def codegen(context, builder, signature, args):
        if AVX2:
            return _call(builder, "llvm.x86.avx2.pmadd.wd", _VI, list(args))
        return _madd_portable(builder, *args)

    return sig, codegen


@intrinsic
def vadd32(typingctx, a, b):
    sig = i32x8(i32x8, i32x8)
    return sig, lambda context, builder, signature, args: builder.add(*args)


@intrinsic
def vcvt8(typingctx, v):
    """int32 lanes -> float32 (exact below 2^24)"""
    sig = f32x8(i32x8)
    return sig, lambda context, builder, signature, args: builder.sitofp(args[0], _VF)


@intrinsic
def vfma8(typingctx, a, b, c):
    """a*b + c rounded once, lane by lane"""
    sig = f32x8(f32x8, f32x8, f32x8)
    return sig, lambda context, builder, signature, args: _call(builder, "llvm.fma.v8f32", _VF,
                                                                 list(args))


@intrinsic
def vmul8(typingctx, a, b):
    sig = f32x8(f32x8, f32x8)
    return sig, lambda context, builder, signature, args: builder.fmul(*args)


@intrinsic
def vzero8(typingctx):
    return f32x8(), lambda context, builder, signature, args: ir.Constant(_VF, [0.0] * 8)


def _splat32(builder, x):
    v = builder.insert_element(ir.Constant(_VI, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, _const(_VI, [0] * 8))


@intrinsic
def vsum8(typingctx, v):
    """The tree sum of 8 lanes: j + j+4, then j + j+2, then j + j+1"""
    sig = types.float32(f32x8)

    def codegen(context, builder, signature, args):
        v = args[0]
        for half in (4, 2, 1):
            lo = builder.shuffle_vector(v, v, _const(_VI, [i % half for i in range(8)]))
            hi = builder.shuffle_vector(v, v, _const(_VI, [half + i % half for i in range(8)]))
            v = builder.fadd(lo, hi)
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return sig, codegen


# ---------------------------------------------------------------- quantizing activations


@intrinsic
def vround8_store(typingctx, x, i, inv, q, j):
    """q[j : j+8] = rint(x[i : i+8] * inv) as int16 (|values| <= 32767 by the caller's scale);
    returns the 8 codes' sum (exact)"""
    sig = types.int32(x, types.intp, types.float32, q, types.intp)

    def codegen(context, builder, signature, args):
        xs, i, inv, qs, j = args
        v = builder.load(_ptr(context, builder, x, xs, i, _VF), align=4)
        scale = builder.shuffle_vector(
            builder.insert_element(ir.Constant(_VF, ir.Undefined), inv, ir.Constant(_I32, 0)),
            ir.Constant(_VF, ir.Undefined), _const(_VI, [0] * 8))
        r = _call(builder, "llvm.rint.v8f32", _VF, [builder.fmul(v, scale)])
        n = builder.fptosi(r, _VI)
        builder.store(builder.trunc(n, ir.VectorType(_I16, 8)),
                      _ptr(context, builder, q, qs, j, ir.VectorType(_I16, 8)), align=2)
        return _call(builder, "llvm.vector.reduce.add.v8i32", _I32, [n])

    return sig, codegen


# ---------------------------------------------------------------- tiles' helpers


@intrinsic
def wload_u4w(typingctx, arr, i):
    """The 32 bytes at byte i of a uint8 array as 16 words w -> (w & 15, w >> 4 & 15,
    w >> 8 & 15, w >> 12) as 16 x int16: the four nibbles of each word, without a widening"""
    sig = types.UniTuple(i16x16, 4)(arr, types.intp)

    def codegen(context, builder, signature, args):
        w = builder.load(_ptr(context, builder, arr, args[0], args[1], _VW), align=1)
        low = _const(_VW, [15] * 16)
        parts = [builder.and_(w, low)]
        for s in (4, 8):
            parts.append(builder.and_(builder.lshr(w, _const(_VW, [s] * 16)), low))
        parts.append(builder.lshr(w, _const(_VW, [12] * 16)))
        return context.make_tuple(builder, signature.return_type, parts)

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, i):
    """Ask for the cache line holding byte i of a uint8 array (a hint: no fault, no result)"""
    sig = types.void(arr, types.intp)

    def codegen(context, builder, signature, args):
        p = _ptr(context, builder, arr, args[0], args[1], ir.IntType(8))
        _call(builder, "llvm.prefetch.p0", ir.VoidType(),
              [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def vspreadn(typingctx, v, n):
    """[v[i*n/8] for lane i]: a group of n (2, 4 or 8) blocks' scales spread over its lanes,
    block b's in lanes 8b/n..8(b+1)/n-1"""
    sig = f32x8(f32x8, types.intp)

    def codegen(context, builder, signature, args):
        v, n = args
        idx = builder.lshr(builder.mul(_const(_VI, list(range(8))),
                                       _splat32(builder, builder.trunc(n, _I32))),
                           _const(_VI, [3] * 8))
        if AVX2:
            return _call(builder, "llvm.x86.avx2.permps", _VF, [v, idx])
        out = ir.Constant(_VF, ir.Undefined)
        for k in range(8):
            e = builder.extract_element(v, builder.extract_element(idx, ir.Constant(_I32, k)))
            out = builder.insert_element(out, e, ir.Constant(_I32, k))
        return out

    return sig, codegen
