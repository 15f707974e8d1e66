# packed_matmul_q8_0 and packed_matmul_q4_0: y[M, N] = x[M, K] @ W[N, K]^T + bias[N] on the CPU
# (an empty bias: none), W in llama.cpp's 8-bit or 4-bit blocks (1.0625 or 0.5625 bytes a weight;
# layout in packed_layout.mojo):
#
#   q8_0   blocks of 32 int8 values, one float16 scale a block (w = q * d)
#   q4_0   blocks of 32 values 0..15, one float16 scale a block (w = (q - 8) * d)
#
# Each row of x is first quantized the same way (int8 blocks of 32, a float32 scale
# each), as llama.cpp does, so a block's dot products are integer multiply-adds. On
# AVX2: vpmaddubsw takes an unsigned and a signed operand; q8_0 pairs |x| with w
# carrying x's sign (|x|, |w| <= 127: a pair of products cannot saturate 16 bits);
# q4_0's values are already unsigned (0..15), and the offset comes off as 8 * sum(x).
# With VNNI (AVX-512 or AVX-VNNI), vpdpbusd sums 4 such products into int32 in one
# instruction (batch 8 about 1.3x faster; batch 1 is bound by memory either way), with no
# 16-bit pair to saturate: for several rows of x, q8_0 then takes x + 128 (1..255) as the
# unsigned operand and w as stored, and 128 * sum(w) comes off once a block for all of them
# (no sign flip of w per row of x: a batch of 8's products 1.43x faster; for one row, summing
# w is the extra work, 2-4 % slower, so one row keeps the sign flip).
# Streaming W is the work: every cache line of a block is prefetched ahead of its loads
# (one prefetch a block left half of q4_0's lines and 3 in 4 of q8_0's to the hardware,
# and the products ran at 17 and 19.5 GB/s instead of 22).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.collections import Array
from std.memory import UnsafePointer, bitcast
from std.sys.info import CompilationTarget
from std.sys.intrinsics import PrefetchOptions, llvm_intrinsic, prefetch

from .epilogue import STORE, finish
from .packed_layout import (
    BLOCK,
    F32,
    GROUP,
    PREFETCH_AHEAD,
    Q4_0,
    Q8_0,
    SERIAL_BELOW,
    block_bytes,
    check_bias,
    check_blocks,
    check_dense,
    row_chunks,
)
from .quantized_rows import QuantizedRows


@always_inline
def _pair_products(a: SIMD[DType.uint8, 32], b: SIMD[DType.int8, 32]) -> SIMD[DType.int16, 16]:
    """Sums of 2 adjacent products a * b (unsigned x signed) into int16 lanes; no pair may pass 32767."""
    comptime if CompilationTarget.has_avx2():
        return llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 16]](a, b)
    else:
        var products = a.cast[DType.int16]() * b.cast[DType.int16]()
        var even, odd = products.deinterleave()
        return even + odd


@always_inline
def _widen_pairs(pairs: SIMD[DType.int16, 16]) -> SIMD[DType.int32, 8]:
    """Sums of 2 adjacent int16 lanes into int32 lanes (vpmaddwd by ones)."""
    comptime if CompilationTarget.has_avx2():
        return llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, 8]](pairs, SIMD[DType.int16, 16](1))
    else:
        var even, odd = pairs.cast[DType.int32]().deinterleave()
        return even + odd


@always_inline
def _dot4_add(acc: SIMD[DType.int32, 8], a: SIMD[DType.uint8, 32], b: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """acc plus the sums of 4 adjacent products a * b (unsigned x signed) in int32 lanes: one
    vpdpbusd with VNNI, else two multiply-adds (no pair of products may pass 32767)."""
    comptime if CompilationTarget.has_vnni():
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.256", SIMD[DType.int32, 8]](acc, a, bitcast[DType.uint8, 32](b))
    else:
        return acc + _widen_pairs(_pair_products(a, b))


@always_inline
def _with_sign_of(w: SIMD[DType.int8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int8, 32]:
    """w negated where x < 0 and zeroed where x == 0 (vpsignb)."""
    comptime if CompilationTarget.has_avx2():
        return llvm_intrinsic["llvm.x86.avx2.psign.b", SIMD[DType.int8, 32]](w, x)
    else:
        var sign = max(min(x.cast[DType.int16](), 1), -1)
        return (w.cast[DType.int16]() * sign).cast[DType.int8]()


@always_inline
def _repeat4[dtype: DType](at: UnsafePointer[Scalar[dtype], MutUntrackedOrigin]) -> SIMD[dtype, 32]:
    """The 4 bytes at `at`, repeated 8 times (vpbroadcastd)."""
    var word = at.bitcast[Int32]().load()
    return bitcast[dtype, 32](SIMD[DType.int32, 8](word))


@always_inline
def _group_blocks[
    FORMAT: Int, MB: Int, EPILOGUE: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[FORMAT],
    m0: Int,
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    N: Int,
    g: Int,
):
    """y[m0 + m, 8g + r] for m < MB, r < 8 (those below N): group g of W's rows against MB rows of x,
    plus bias[8g + r] where there is a bias."""
    comptime BYTES = block_bytes[FORMAT]()
    var nb = xq.blocks
    var acc = Array[SIMD[F32, 8], MB](fill=SIMD[F32, 8](0))
    var group = w + g * nb * BYTES
    for b in range(nb):
        var block = group + b * BYTES
        comptime for line in range(BYTES // 64):  # every cache line of the block
            prefetch[PrefetchOptions().for_read().low_locality()](block + PREFETCH_AHEAD + 64 * line)
        var scales = (d + (g * nb + b) * GROUP).load[width=GROUP]().cast[F32]()  # 8 rows' scales
        comptime OFFSET_X = FORMAT == Q8_0 and CompilationTarget.has_vnni() and MB > 1
        var w_sums = SIMD[DType.int32, 8](0)  # with OFFSET_X: 128 * sum(w) of each row over the block
        comptime if OFFSET_X:
            comptime for chunk in range(8):
                var values = (block + chunk * 32).bitcast[Int8]().load[width=32]()
                w_sums = _dot4_add(w_sums, SIMD[DType.uint8, 32](128), values)
        # With VNNI, every row of x's dot products with this block, chunk by chunk across the rows:
        # the MB chains of multiply-adds are independent and run side by side, and q4_0's chains start
        # from the -8 offset loaded from memory instead of subtracting it from a register made
        # for it (a q4_0 batch of 8's products 1.11x faster on a Zen 4; one row the same).
        var dots = Array[SIMD[DType.int32, 8], MB](fill=SIMD[DType.int32, 8](0))
        comptime if OFFSET_X:
            comptime for chunk in range(8):
                var values = (block + chunk * 32).bitcast[Int8]().load[width=32]()
                comptime for m in range(MB):
                    var offset = xq.offset + ((m0 + m) * nb + b) * BLOCK
                    dots[m] = _dot4_add(dots[m], _repeat4[DType.uint8](offset + 4 * chunk), values)
            comptime for m in range(MB):
                dots[m] -= w_sums  # the + 128 of every x, times sum(w)
        elif FORMAT == Q8_0:
            # Row by row, each chunk reloaded from L1: with 16 vector registers (AVX2), 8 rows' sums
            # side by side beside their 8 accumulators spilled to memory, and a batch of 8's products
            # took 1.14x the time (2-core Zen 3; whole steps 1.12x).
            comptime for m in range(MB):
                var row = (m0 + m) * nb + b
                comptime for chunk in range(8):
                    var values = (block + chunk * 32).bitcast[Int8]().load[width=32]()
                    var signed = _with_sign_of(values, _repeat4[DType.int8](xq.quants + row * BLOCK + 4 * chunk))
                    dots[m] = _dot4_add(dots[m], _repeat4[DType.uint8](xq.magnitudes + row * BLOCK + 4 * chunk), signed)
        elif CompilationTarget.has_vnni():
            comptime for m in range(MB):
                dots[m] = SIMD[DType.int32, 8](xq.q4_offsets[(m0 + m) * nb + b])  # the -8 of every value, times sum(x)
            comptime for chunk in range(4):
                var raw = (block + chunk * 32).load[width=32]()
                var low = raw & 0xF
                var high = raw >> 4
                comptime for m in range(MB):
                    var quants = xq.quants + ((m0 + m) * nb + b) * BLOCK
                    dots[m] = _dot4_add(dots[m], low, _repeat4[DType.int8](quants + 4 * chunk))
                    dots[m] = _dot4_add(dots[m], high, _repeat4[DType.int8](quants + 16 + 4 * chunk))
        else:
            comptime for m in range(MB):
                var row = (m0 + m) * nb + b
                var quants = xq.quants + row * BLOCK
                # A pair of products is at most 2 * 15 * 127 = 3810, so the 8 pairs a lane gathers
                # over the block stay in int16; widening once per block halves the multiplies.
                var pairs = SIMD[DType.int16, 16](0)
                comptime for chunk in range(4):
                    var raw = (block + chunk * 32).load[width=32]()
                    pairs += _pair_products(raw & 0xF, _repeat4[DType.int8](quants + 4 * chunk))
                    pairs += _pair_products(raw >> 4, _repeat4[DType.int8](quants + 16 + 4 * chunk))
                dots[m] = _widen_pairs(pairs) + xq.q4_offsets[row]  # the -8 of every value, times sum(x)
        comptime for m in range(MB):
            acc[m] = dots[m].cast[F32]().fma(scales * xq.scales[(m0 + m) * nb + b], acc[m])
    var offsets = SIMD[F32, GROUP](0)
    if has_bias:
        for r in range(min(GROUP, N - g * GROUP)):
            offsets[r] = bias[g * GROUP + r]
    comptime for m in range(MB):
        var out = y + (m0 + m) * N + g * GROUP
        if g * GROUP + GROUP <= N:
            finish[EPILOGUE, GROUP](out, acc[m] + offsets)
        else:
            for r in range(N - g * GROUP):
                finish[EPILOGUE, 1](out + r, acc[m][r] + offsets[r])


def block_groups[
    FORMAT: Int, EPILOGUE: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[FORMAT],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    N: Int,
    first: Int,
    last: Int,
):
    """Groups first..last-1 of W's rows (8 outputs each) against the M rows of `xq`, written into
    y [M, N] as EPILOGUE says (epilogue.mojo): up to 8 rows of x a group, while its blocks are in cache."""
    for g in range(first, last):
        var m = 0
        while m < M:
            var left = M - m
            if left >= 8:
                _group_blocks[FORMAT, 8, EPILOGUE](w, d, xq, m, bias, has_bias, y, N, g)
                m += 8
            elif left >= 4:
                _group_blocks[FORMAT, 4, EPILOGUE](w, d, xq, m, bias, has_bias, y, N, g)
                m += 4
            elif left >= 2:
                _group_blocks[FORMAT, 2, EPILOGUE](w, d, xq, m, bias, has_bias, y, N, g)
                m += 2
            else:
                _group_blocks[FORMAT, 1, EPILOGUE](w, d, xq, m, bias, has_bias, y, N, g)
                m += 1


def packed_matmul_blocks[
    FORMAT: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
):
    """Y = x @ W^T (+ bias [N]) for dense row-major x [M, K] and y [M, N], W q8_0 or q4_0 in groups of 8 rows."""
    var xq = QuantizedRows[FORMAT](x, M, K)
    var groups = (N + GROUP - 1) // GROUP
    var chunk = (groups + row_chunks() - 1) // row_chunks()
    var tasks = (groups + chunk - 1) // chunk

    def work(task: Int) {imm w, imm d, imm bias, imm has_bias, imm y, imm xq, imm M, imm N, imm groups, imm chunk}:
        block_groups[FORMAT, STORE](w, d, xq, bias, has_bias, y, M, N, task * chunk, min((task + 1) * chunk, groups))

    # Waking the other threads costs more than a small product gains from them.
    if tasks == 1 or groups * xq.blocks * block_bytes[FORMAT]() < SERIAL_BELOW:
        for task in range(tasks):
            work(task)
    else:
        sync_parallelize(work, tasks)
    xq.free()


@always_inline
def _execute_blocks[
    FORMAT: Int, name: StaticString
](
    y: OutputTensor[dtype=F32, rank=2, ...],
    x: InputTensor[dtype=F32, rank=2, ...],
    w: InputTensor[rank=2, ...],
    d: InputTensor[dtype=DType.float16, rank=2, ...],
    bias: InputTensor[dtype=F32, rank=1, ...],
) raises:
    var M, K, N = x.dim_size(0), x.dim_size(1), y.dim_size(1)
    if y.dim_size(0) != M:
        raise Error(name, ": x has ", M, " rows and y ", y.dim_size(0))
    check_bias(name, N, bias.dim_size(0), bias.stride_length(0))
    check_blocks(name, FORMAT, K, N, w.dim_size(0), w.dim_size(1), d.dim_size(0), d.dim_size(1))
    check_dense(name, M, K, x.stride_length(0), x.stride_length(1))
    check_dense(name, w.dim_size(0), w.dim_size(1), w.stride_length(0), w.stride_length(1))
    check_dense(name, d.dim_size(0), d.dim_size(1), d.stride_length(0), d.stride_length(1))
    check_dense(name, M, N, y.stride_length(0), y.stride_length(1))
    packed_matmul_blocks[FORMAT](
        UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr())),
        UnsafePointer[UInt8, ImmutAnyOrigin](unsafe_from_address=Int(w.unsafe_ptr())),
        UnsafePointer[Float16, ImmutAnyOrigin](unsafe_from_address=Int(d.unsafe_ptr())),
        UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(bias.unsafe_ptr())),
        bias.dim_size(0) == N,
        UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr())),
        M,
        K,
        N,
    )


@extensibility.register("packed_matmul_q8_0")
struct PackedMatmulQ8:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=DType.int8, rank=2, ...],
        d: InputTensor[dtype=DType.float16, rank=2, ...],
        bias: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "packed_matmul_q8_0 runs on the CPU"
        _execute_blocks[Q8_0, "packed_matmul_q8_0"](y, x, w, d, bias)


@extensibility.register("packed_matmul_q4_0")
struct PackedMatmulQ4:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        d: InputTensor[dtype=DType.float16, rank=2, ...],
        bias: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "packed_matmul_q4_0 runs on the CPU"
        _execute_blocks[Q4_0, "packed_matmul_q4_0"](y, x, w, d, bias)
