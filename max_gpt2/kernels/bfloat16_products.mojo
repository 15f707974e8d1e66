# How the bfloat16 products meet x: each row of x is first rounded to bfloat16, as llama.cpp rounds
# it for its bf16 weights, so that the product of a weight and a value of x is exact in float32 and
# only the float32 sums round. With AVX-512 BF16, vdpbf16ps then adds two such products to each of
# 16 float32 lanes in one instruction, twice a multiply-add's work: against several rows of x the
# multiply-add pipes, not memory, bound the products, and the pairs shorten a batch's steps. One row
# takes the pairs too, though memory bounds it and lane by lane was a little faster there: so a row's
# sums are the same however many rows share the product (a drafted token checked beside others gets
# the logits of a step of its own, which speculative decoding's exactness rests on;
# docs/performance.md). A CPU without the instruction widens both to float32 and multiplies and adds
# lane by lane, for every row alike.
#
# Where the CPU has no bfloat16 instructions (AVX2, and AVX-512 without BF16) LLVM keeps a
# bfloat16 vector as float32 and rounds it back through a library call a value whenever it
# materialises one: there the products hold no bfloat16 vector at all, only its bits (uint16),
# widened by a shift and rounded by integer operations (through bfloat16 vectors the products ran
# an order of magnitude slower), and x is kept as float32 holding the rounded values, widened once a
# product instead of at every multiply-add.
from std.memory import UnsafePointer, alloc, bitcast
from std.sys.info import CompilationTarget
from std.sys.intrinsics import llvm_intrinsic

from .packed_layout import CHUNK, F32, GROUP, LANES, row_start

comptime BF16_PAIRS = CompilationTarget._has_feature["avx512bf16"]() and LANES == 16


def x_dtype[WT: DType]() -> DType:
    """What x is multiplied in against W of dtype WT: float32; against bfloat16 rounded to bfloat16,
    and kept so where vdpbf16ps takes it (`BF16_PAIRS`), else as float32 holding the rounded values
    (exact), widened once instead of at every multiply-add."""
    return DType.bfloat16 if WT != F32 and BF16_PAIRS else F32


@always_inline
def x_stride[WT: DType](K: Int) -> Int:
    """Values from one row of x to the next: K, or against bfloat16 K padded with zeros to whole
    `CHUNK`s, as W's rows are."""
    return K if WT == F32 else (K + CHUNK - 1) // CHUNK * CHUNK


@always_inline
def bfloat16_bits[W: Int](values: SIMD[F32, W]) -> SIMD[DType.uint16, W]:
    """Values rounded to bfloat16 (to nearest, ties to even; NaN to a quiet NaN), as their bits."""
    var bits = bitcast[DType.uint32, W](values)
    var rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    return values.ne(values).select(SIMD[DType.uint32, W](0x7FC0), rounded).cast[DType.uint16]()


@always_inline
def _from_bits[XT: DType, W: Int](bits: SIMD[DType.uint16, W]) -> SIMD[XT, W]:
    """bfloat16 bits as XT: bfloat16, or float32 (exact)."""
    comptime if XT == DType.bfloat16:
        return bitcast[XT, W](bits)
    else:
        return bitcast[XT, W](bits.cast[DType.uint32]() << 16)


def rounded_rows[XT: DType](x: UnsafePointer[Float32, ImmutAnyOrigin], M: Int, K: Int) -> UnsafePointer[Scalar[XT], MutUntrackedOrigin]:
    """x [M, K] rounded to bfloat16 (`bfloat16_bits`) in a new buffer [M, x_stride(K)] of XT
    (`x_dtype`), padded with zeros; the caller frees it."""
    var stride = x_stride[DType.bfloat16](K)
    var rounded = alloc[Scalar[XT]](M * stride)
    for m in range(M):
        var k = 0
        while k + LANES <= K:
            (rounded + m * stride + k).store(_from_bits[XT](bfloat16_bits((x + m * K + k).load[width=LANES]())))
            k += LANES
        for rest in range(k, stride):
            rounded[m * stride + rest] = _from_bits[XT, 1](bfloat16_bits[1](x[m * K + rest])) if rest < K else 0
    return rounded


def operand_dtype[PAIRS: Bool]() -> DType:
    """What a multiply-add takes W and x in: bfloat16 for pairs, else float32."""
    return DType.bfloat16 if PAIRS else F32


@always_inline
def load_operand[
    T: DType, PAIRS: Bool, STEP: Int
](at: UnsafePointer[Scalar[T], _]) -> SIMD[operand_dtype[PAIRS](), STEP]:
    """STEP values of W or x at `at` as `multiply_add` takes them: as stored (float32, or bfloat16
    for pairs), or bfloat16 widened to float32 (exact) from its bits."""
    comptime if T == F32 or PAIRS:
        return rebind[SIMD[operand_dtype[PAIRS](), STEP]](at.load[width=STEP]())
    else:
        return rebind[SIMD[operand_dtype[PAIRS](), STEP]](_from_bits[F32](at.bitcast[UInt16]().load[width=STEP]()))


@always_inline
def multiply_add[
    PAIRS: Bool, STEP: Int
](acc: SIMD[F32, LANES], w: SIMD[operand_dtype[PAIRS](), STEP], x: SIMD[operand_dtype[PAIRS](), STEP]) -> SIMD[F32, LANES]:
    """acc plus w * x lane by lane (float32, STEP = LANES), or plus each lane's two neighbouring
    products (bfloat16 pairs, STEP = 2 * LANES: vdpbf16ps, where `BF16_PAIRS`)."""
    comptime if PAIRS:
        return llvm_intrinsic["llvm.x86.avx512bf16.dpbf16ps.512", SIMD[F32, LANES]](acc, w, x)
    else:
        return rebind[SIMD[F32, LANES]](w).fma(rebind[SIMD[F32, LANES]](x), acc)


def widened_rows[WT: DType](w: UnsafePointer[Scalar[WT], ImmutAnyOrigin], panel: UnsafePointer[Float32, MutUntrackedOrigin], K: Int, start: Int, end: Int):
    """Rows start..end-1 of bfloat16 W (interleaved groups) widened into `panel` as float32 rows,
    `x_stride(K)` values apart (padded with zeros as W's rows are)."""
    var stride = x_stride[WT](K)
    for n in range(start, end):
        var row = w + row_start[WT](n, K)
        var widened = panel + (n - start) * stride
        var k = 0
        while k < stride:  # a chunk of the row, then past the group's other rows to its next
            comptime for lane in range(0, CHUNK, LANES):
                widened.store(k + lane, rebind[SIMD[F32, LANES]](load_operand[WT, False, LANES](row + lane)))
            k += CHUNK
            row += GROUP * CHUNK
