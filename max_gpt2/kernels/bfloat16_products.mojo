# How the bfloat16 products meet x: each row of x is first rounded to bfloat16, as llama.cpp rounds
# it for its bf16 weights, so that the product of a weight and a value of x is exact in float32 and
# only the float32 sums round. With AVX-512 BF16, vdpbf16ps then adds two such products to each of
# 16 float32 lanes in one instruction, twice a multiply-add's work: against several rows of x a
# 2-core Zen 4's multiply-add pipes, not memory, bound the products, and a batch of 8's decoding
# steps took 0.79-0.81x the time (benchmarks/kernel_ab.py --steps 8x32,8x100). Against one row memory
# is the bound and the pairs made the steps 1.05x as long, so one row (and a CPU without the
# instruction) widens both to float32 and multiplies and adds lane by lane.
from std.memory import UnsafePointer, alloc
from std.sys.info import CompilationTarget
from std.sys.intrinsics import llvm_intrinsic

from .packed_layout import CHUNK, F32, LANES

comptime BF16_PAIRS = CompilationTarget._has_feature["avx512bf16"]() and LANES == 16


def x_dtype[WT: DType]() -> DType:
    """What x is multiplied in against W of dtype WT: float32, or bfloat16 against bfloat16."""
    return F32 if WT == F32 else DType.bfloat16


@always_inline
def x_stride[WT: DType](K: Int) -> Int:
    """Values from one row of x to the next: K, or against bfloat16 K padded with zeros to whole
    `CHUNK`s, as W's rows are."""
    return K if WT == F32 else (K + CHUNK - 1) // CHUNK * CHUNK


def rounded_rows(x: UnsafePointer[Float32, ImmutAnyOrigin], M: Int, K: Int) -> UnsafePointer[BFloat16, MutUntrackedOrigin]:
    """x [M, K] rounded to bfloat16 (to nearest, ties to even) in a new buffer [M, x_stride(K)],
    padded with zeros; the caller frees it."""
    var stride = x_stride[DType.bfloat16](K)
    var rounded = alloc[BFloat16](M * stride)
    for m in range(M):
        var k = 0
        while k + LANES <= K:
            (rounded + m * stride + k).store((x + m * K + k).load[width=LANES]().cast[DType.bfloat16]())
            k += LANES
        for rest in range(k, stride):
            rounded[m * stride + rest] = x[m * K + rest].cast[DType.bfloat16]() if rest < K else 0
    return rounded


@always_inline
def multiply_add[
    WT: DType, STEP: Int
](acc: SIMD[F32, LANES], w: SIMD[WT, STEP], x: SIMD[x_dtype[WT](), STEP]) -> SIMD[F32, LANES]:
    """acc plus w * x lane by lane (STEP = LANES, both widened to float32), or plus each lane's two
    neighbouring products (STEP = 2 * LANES bfloat16 values: vdpbf16ps, where `BF16_PAIRS`)."""
    comptime if STEP == LANES:
        return rebind[SIMD[F32, LANES]](w.cast[F32]()).fma(rebind[SIMD[F32, LANES]](x.cast[F32]()), acc)
    else:
        return llvm_intrinsic["llvm.x86.avx512bf16.dpbf16ps.512", SIMD[F32, LANES]](acc, w, x)
