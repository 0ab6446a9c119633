"""Frozen copies of the `kolibri_cli.engine.simd8` float ops that `int16_before` uses (an
8-lane load, zero, fused multiply-add and the fixed tree sum), on their own vector type, so a
change to simd8 moves the kernel and not this oracle."""

import llvmlite.ir as ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model


class _F32x8(types.Type):
    def __init__(self):
        super().__init__(name="f32x8_before")


f32x8 = _F32x8()
_I32 = ir.IntType(32)
_VI = ir.VectorType(_I32, 8)
_VF = ir.VectorType(ir.FloatType(), 8)


@register_model(_F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


def _ptr(context, builder, arrty, arr, i, elty):
    """Pointer to element i of the flat C-contiguous array arr, cast to elty*"""
    data = cgutils.create_struct_proxy(arrty)(context, builder, value=arr).data
    return builder.bitcast(builder.gep(data, [i]), elty.as_pointer())


def _call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _const(vt, values):
    return ir.Constant(vt, values)


# ---------------------------------------------------------------- the float ops


@intrinsic
def fload(typingctx, arr, i):
    """8 float32 at element i of a float32 array"""
    sig = f32x8(arr, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_ptr(context, builder, arr, args[0], args[1], _VF), align=4)

    return sig, codegen


@intrinsic
def vzero8(typingctx):
    return f32x8(), lambda context, builder, signature, args: ir.Constant(_VF, [0.0] * 8)


@intrinsic
def vfma8(typingctx, a, b, c):
    """a*b + c rounded once, lane by lane"""
    sig = f32x8(f32x8, f32x8, f32x8)
    return sig, lambda context, builder, signature, args: _call(builder, "llvm.fma.v8f32", _VF,
                                                                 list(args))


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
