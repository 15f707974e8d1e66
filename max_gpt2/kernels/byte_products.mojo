# The byte multiply-adds of the q8_0 and q4_0 products on x86, in 8 int32 lanes (a ymm register:
# one group of 8 rows of W) or, with AVX-512 VNNI, 16 (a zmm register: two groups side by side).
# On AVX2, vpmaddubsw takes an unsigned and a signed operand; q8_0 pairs |x| with w carrying x's
# sign (|x|, |w| <= 127: a pair of products cannot saturate 16 bits); q4_0's values are already
# unsigned (0..15), and the offset comes off as 8 * sum(x). With AVX-512 VNNI (AVX-VNNI alone takes
# the AVX2 path), vpdpbusd sums 4 such products into int32 in one instruction (faster against
# several rows of x; one row is bound by memory either way), with no 16-bit pair to saturate.
from std.memory import UnsafePointer, bitcast
from std.sys.info import CompilationTarget
from std.sys.intrinsics import llvm_intrinsic


@always_inline
def pair_products(a: SIMD[DType.uint8, 32], b: SIMD[DType.int8, 32]) -> SIMD[DType.int16, 16]:
    """Sums of 2 adjacent products a * b (unsigned x signed) into int16 lanes; no pair may pass 32767."""
    comptime if CompilationTarget.has_avx2():
        return llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 16]](a, b)
    else:
        var products = a.cast[DType.int16]() * b.cast[DType.int16]()
        var even, odd = products.deinterleave()
        return even + odd


@always_inline
def word_products[L: Int](a: SIMD[DType.int16, 2 * L], b: SIMD[DType.int16, 2 * L]) -> SIMD[DType.int32, L]:
    """Sums of 2 adjacent products a * b (int16 x int16) into L int32 lanes (vpmaddwd)."""
    comptime if CompilationTarget.has_avx512f() and L == 16:
        return llvm_intrinsic["llvm.x86.avx512.pmaddw.d.512", SIMD[DType.int32, L]](a, b)
    elif CompilationTarget.has_avx2() and L == 8:
        return llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, L]](a, b)
    else:
        var even, odd = (a.cast[DType.int32]() * b.cast[DType.int32]()).deinterleave()
        return rebind[SIMD[DType.int32, L]](even + odd)


@always_inline
def widen_pairs(pairs: SIMD[DType.int16, 16]) -> SIMD[DType.int32, 8]:
    """Sums of 2 adjacent int16 lanes into int32 lanes (vpmaddwd by ones)."""
    return word_products[8](pairs, SIMD[DType.int16, 16](1))


@always_inline
def dot4_add[
    L: Int
](acc: SIMD[DType.int32, L], a: SIMD[DType.uint8, 4 * L], b: SIMD[DType.int8, 4 * L]) -> SIMD[DType.int32, L]:
    """acc plus the sums of 4 adjacent products a * b (unsigned x signed) in int32 lanes: one
    vpdpbusd with VNNI, else two multiply-adds (no pair of products may pass 32767)."""
    comptime if CompilationTarget.has_vnni() and L == 16:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, L]](acc, a, bitcast[DType.uint8, 4 * L](b))
    elif CompilationTarget.has_vnni() and L == 8:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.256", SIMD[DType.int32, L]](acc, a, bitcast[DType.uint8, 4 * L](b))
    else:
        comptime assert L == 8, "16 lanes need AVX-512 VNNI"
        var products = widen_pairs(pair_products(rebind[SIMD[DType.uint8, 32]](a), rebind[SIMD[DType.int8, 32]](b)))
        return acc + rebind[SIMD[DType.int32, L]](products)


@always_inline
def with_sign_of(w: SIMD[DType.int8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int8, 32]:
    """w negated where x < 0 and zeroed where x == 0 (vpsignb)."""
    comptime if CompilationTarget.has_avx2():
        return llvm_intrinsic["llvm.x86.avx2.psign.b", SIMD[DType.int8, 32]](w, x)
    else:
        var sign = max(min(x.cast[DType.int16](), 1), -1)
        return (w.cast[DType.int16]() * sign).cast[DType.int8]()


@always_inline
def repeat4[dtype: DType, L: Int](at: UnsafePointer[Scalar[dtype], MutUntrackedOrigin]) -> SIMD[dtype, 4 * L]:
    """The 4 bytes at `at`, repeated L times (vpbroadcastd)."""
    var word = at.bitcast[Int32]().load()
    return bitcast[dtype, 4 * L](SIMD[DType.int32, L](word))


@always_inline
def repeat2[L: Int](at: UnsafePointer[Int16, MutUntrackedOrigin]) -> SIMD[DType.int16, 2 * L]:
    """The 2 int16 values at `at`, repeated L times (vpbroadcastd)."""
    var word = at.bitcast[Int32]().load()
    return bitcast[DType.int16, 2 * L](SIMD[DType.int32, L](word))


@always_inline
def side_by_side[
    dtype: DType, width: Int, GROUPS: Int
](at: UnsafePointer[Scalar[dtype], ImmutAnyOrigin], next_group: Int) -> SIMD[dtype, width * GROUPS]:
    """`width` values at `at`, followed with GROUPS = 2 by as many at `at + next_group`."""
    var first = at.load[width=width]()
    comptime if GROUPS == 1:
        return rebind[SIMD[dtype, width * GROUPS]](first)
    else:
        comptime assert GROUPS == 2, "one or two groups at a time"
        return rebind[SIMD[dtype, width * GROUPS]](first.join((at + next_group).load[width=width]()))
