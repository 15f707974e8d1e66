# The block formats' products (gpt2_matmul's, products.mojo): y[M, N] = x[M, K] @ W[N, K]^T + bias[N]
# on the CPU (an empty bias: none), W in llama.cpp's blocks (layout in packed_layout.mojo; the
# K-quants' products in super_blocks.mojo):
#
#   q8_0   blocks of 32 int8 values, one float16 scale a block (w = q * d), 1.0625 bytes a weight
#   q4_0   blocks of 32 values 0..15, one float16 scale a block (w = (q - 8) * d), 0.5625
#   q4_1   the same with a float16 min m a block (w = d * q + m), 0.625
#   q5_0   blocks of 32 values 0..31 (w = (q - 16) * d), 0.6875
#   q5_1   values 0..31 and a min (w = d * q + m), 0.75
#   q4_k   super-blocks of 256: 4-bit values, 6-bit scales and mins per 32, 0.578 (llama.cpp's 0.5625)
#   q5_k   the same with 5-bit values, 0.703 (llama.cpp's 0.6875)
#   q6_k   super-blocks of 256: 6-bit values, int8 scales per 16, 0.8203
#
# Each row of x is first quantized the same way (int8 blocks of 32, a float32 scale
# each), as llama.cpp does, so a block's dot products are integer multiply-adds
# (byte_products.mojo); the offsets of q4_0 and q5_0 (8 and 16) come off through x's block sums,
# and q4_1's and q5_1's min is added times them. With VNNI, for several rows of x, q8_0 takes
# x + 128 (1..255) as the unsigned operand and w as stored, and 128 * sum(w) comes off once a block
# for all of them (no sign flip of w per row of x: faster for a batch; for one row, summing w is the
# extra work, so one row keeps the sign flip).
# Streaming W is the work: every cache line of a block is prefetched ahead of its loads
# (one prefetch a block left most lines to the hardware prefetcher, and the products streamed
# slower: docs/performance.md).

from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from std.collections import Array
from std.memory import UnsafePointer, bitcast
from std.sys.info import CompilationTarget
from std.sys.intrinsics import prefetch

from .byte_products import dot4_add, pair_products, repeat4, side_by_side, widen_pairs, with_sign_of
from .epilogue import STORE, finish_rows
from .packed_layout import (
    BLOCK,
    F32,
    GROUP,
    PREFETCH_AHEAD,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    SERIAL_BELOW,
    activation_of,
    block_bytes,
    block_scales,
    fifth_bits_at,
    has_fifth_bits,
    has_min,
    check_bias,
    check_blocks,
    check_dense,
    is_super,
    requests_ahead,
    row_chunks,
)
from .quantized_rows import QuantizedRows
from .super_blocks import super_block_groups


@always_inline
def _group_blocks[
    X: Int, //, FORMAT: Int, GROUPS: Int, MB: Int, EPILOGUE: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[X],
    m0: Int,
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    N: Int,
    g: Int,
):
    """y[m0 + m, 8g + r] for m < MB, r < 8 * GROUPS (those below N): groups g.. g + GROUPS - 1 of W's
    rows against MB rows of x, plus bias[8g + r] where there is a bias."""
    comptime BYTES = block_bytes[FORMAT]()
    comptime SCALES = block_scales[FORMAT]()
    comptime L = GROUP * GROUPS  # lanes: one a row of W
    var nb = xq.blocks
    var next_group = nb * BYTES  # bytes from a group's block to the next group's
    var acc = Array[SIMD[F32, L], MB](fill=SIMD[F32, L](0))
    var group = w + g * next_group
    for b in range(nb):
        var block = group + b * BYTES
        # Every cache line of the block: a q5_0 or q5_1 block (160 bytes) starts inside a line and
        # spans three.
        comptime LINES = (BYTES + 63) // 64
        comptime if GROUPS == 1:
            comptime for line in range(LINES):
                prefetch[requests_ahead[MB == 1]()](block + PREFETCH_AHEAD + 64 * line)
        else:
            comptime for group in range(GROUPS, 2 * GROUPS):  # the same block of the next two groups
                comptime for line in range(LINES):
                    prefetch[requests_ahead[False]()](block + group * next_group + 64 * line)
        var steps = d + (g * nb + b) * SCALES
        var scales = side_by_side[DType.float16, GROUP, GROUPS](steps, nb * SCALES).cast[F32]()
        # A zmm register has no vpsignb: two groups at a time take q8_0's offset x for one row too.
        comptime OFFSET_X = FORMAT == Q8_0 and CompilationTarget.has_vnni() and (MB > 1 or GROUPS == 2)
        # With VNNI, every row of x's dot products with this block, chunk by chunk across the rows:
        # the MB chains of multiply-adds are independent and run side by side, and q4_0's chains start
        # from the -8 offset loaded from memory instead of subtracting it from a register made
        # for it (faster for a batch; one row the same).
        var dots = Array[SIMD[DType.int32, L], MB](fill=SIMD[DType.int32, L](0))
        comptime if OFFSET_X:
            var w_sums = SIMD[DType.int32, L](0)  # 128 * sum(w) of each row over the block
            comptime for chunk in range(8):
                var values = bitcast[DType.int8, 4 * L](side_by_side[DType.uint8, 32, GROUPS](block + chunk * 32, next_group))
                w_sums = dot4_add(w_sums, SIMD[DType.uint8, 4 * L](128), values)
                comptime for m in range(MB):
                    var offset = xq.offset + ((m0 + m) * nb + b) * BLOCK
                    dots[m] = dot4_add(dots[m], repeat4[DType.uint8, L](offset + 4 * chunk), values)
            comptime for m in range(MB):
                dots[m] -= w_sums  # the + 128 of every x, times sum(w)
        elif FORMAT == Q8_0:
            # Row by row, each chunk reloaded from L1: with 16 vector registers (AVX2), 8 rows' sums
            # side by side beside their 8 accumulators spill to memory, which measured slower.
            comptime assert GROUPS == 1, "vpsignb takes 32 bytes"
            comptime for m in range(MB):
                var row = (m0 + m) * nb + b
                comptime for chunk in range(8):
                    var values = (block + chunk * 32).bitcast[Int8]().load[width=32]()
                    var signed = with_sign_of(values, repeat4[DType.int8, 8](xq.quants + row * BLOCK + 4 * chunk))
                    var magnitudes = repeat4[DType.uint8, 8](xq.magnitudes + row * BLOCK + 4 * chunk)
                    dots[m] = rebind[SIMD[DType.int32, L]](dot4_add[8](rebind[SIMD[DType.int32, 8]](dots[m]), magnitudes, signed))
        elif CompilationTarget.has_vnni() or FORMAT != Q4_0:
            # Without VNNI the 5-bit formats and the mins take this path too, widening each chunk's pairs.
            comptime if FORMAT == Q4_0 or FORMAT == Q5_0:
                comptime OFFSETS = Int32(2 if FORMAT == Q5_0 else 1)  # -8 x sum(x) once or twice: q5_0's -16
                comptime for m in range(MB):
                    dots[m] = SIMD[DType.int32, L](OFFSETS * xq.q4_offsets[(m0 + m) * nb + b])  # every value's offset, times sum(x)
            var fifth = SIMD[DType.uint8, 32 * GROUPS](0)  # bit c: element 4c + e's 5th bit, bit 4 + c: 16 + 4c + e's
            comptime if has_fifth_bits[FORMAT]():
                fifth = side_by_side[DType.uint8, 32, GROUPS](block + fifth_bits_at[FORMAT](), next_group)
            comptime for chunk in range(4):
                var raw = side_by_side[DType.uint8, 32, GROUPS](block + chunk * 32, next_group)
                var low = raw & 0xF
                var high = raw >> 4
                comptime if has_fifth_bits[FORMAT]():
                    low |= (fifth << UInt8(4 - chunk)) & 0x10
                    high |= (fifth >> UInt8(chunk)) & 0x10
                comptime for m in range(MB):
                    var quants = xq.quants + ((m0 + m) * nb + b) * BLOCK
                    dots[m] = dot4_add(dots[m], low, repeat4[DType.int8, L](quants + 4 * chunk))
                    dots[m] = dot4_add(dots[m], high, repeat4[DType.int8, L](quants + 16 + 4 * chunk))
        else:
            comptime assert GROUPS == 1, "two groups at a time need AVX-512 VNNI"
            comptime for m in range(MB):
                var row = (m0 + m) * nb + b
                var quants = xq.quants + row * BLOCK
                # A pair of products is at most 2 * 15 * 127 = 3810, so the 8 pairs a lane gathers
                # over the block stay in int16; widening once per block halves the multiplies.
                var pairs = SIMD[DType.int16, 16](0)
                comptime for chunk in range(4):
                    var raw = (block + chunk * 32).load[width=32]()
                    pairs += pair_products(raw & 0xF, repeat4[DType.int8, 8](quants + 4 * chunk))
                    pairs += pair_products(raw >> 4, repeat4[DType.int8, 8](quants + 16 + 4 * chunk))
                dots[m] = rebind[SIMD[DType.int32, L]](widen_pairs(pairs) + xq.q4_offsets[row])  # the -8 of every value, times sum(x)
        comptime for m in range(MB):
            acc[m] = dots[m].cast[F32]().fma(scales * xq.scales[(m0 + m) * nb + b], acc[m])
        comptime if has_min[FORMAT]():
            var mins = side_by_side[DType.float16, GROUP, GROUPS](steps + GROUP, nb * SCALES).cast[F32]()
            comptime for m in range(MB):
                var row = (m0 + m) * nb + b
                var x_sum = Float32(xq.q4_offsets[row]) * Float32(-0.125)  # sum(x)'s quants, from -8 x it (exact)
                acc[m] = mins.fma(x_sum * xq.scales[row], acc[m])
    finish_rows[EPILOGUE, L, MB](acc, bias, has_bias, y, m0, N, g * GROUP)


@always_inline
def _rows_of_x[
    X: Int, //, FORMAT: Int, GROUPS: Int, EPILOGUE: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[X],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    N: Int,
    g: Int,
):
    """Groups g.. g + GROUPS - 1 against the M rows of `xq`: up to 8 rows of x at a time, while the
    groups' blocks are in cache."""
    var m = 0
    comptime for halving in range(4):  # 8 rows of x at a time, then 4, 2, 1
        comptime MB = 8 >> halving
        while M - m >= MB:
            _group_blocks[FORMAT, GROUPS, MB, EPILOGUE](w, d, xq, m, bias, has_bias, y, N, g)
            m += MB


def block_groups[
    X: Int, //, FORMAT: Int, EPILOGUE: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[X],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    N: Int,
    first: Int,
    last: Int,
):
    """Groups first..last-1 of W's rows (8 outputs each) against the M rows of `xq` (x rounded as
    FORMAT's products read it, `activation_of`), written into y [M, N] as EPILOGUE says (epilogue.mojo)."""
    comptime assert X == activation_of[FORMAT](), "x rounded for another format"
    comptime if is_super[FORMAT]():
        super_block_groups[FORMAT, EPILOGUE](w, d, xq, bias, has_bias, y, M, N, first, last)
    else:
        # Two groups side by side halve the multiply-adds but read W as two streams, which costs at
        # few rows of x, where memory bounds the product: pairs from `PAIRED_FROM` rows, where they
        # measured faster (docs/performance.md).
        comptime PAIRED = CompilationTarget.has_avx512f() and CompilationTarget.has_vnni()
        comptime PAIRED_FROM = 8 if FORMAT == Q8_0 else 4  # rows of x
        var g = first
        comptime if PAIRED:
            while g + 1 < last and M >= PAIRED_FROM:
                _rows_of_x[FORMAT, 2, EPILOGUE](w, d, xq, bias, has_bias, y, M, N, g)
                g += 2
        while g < last:
            _rows_of_x[FORMAT, 1, EPILOGUE](w, d, xq, bias, has_bias, y, M, N, g)
            g += 1


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
    """Y = x @ W^T (+ bias [N]) for dense row-major x [M, K] and y [M, N], W in a block format (q8_0, q4_0,
    q4_1, q5_0, q5_1, q4_k, q5_k, q6_k) in groups of 8 rows."""
    var xq = QuantizedRows[activation_of[FORMAT]()](x, M, K)
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
def execute_blocks[
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
    check_blocks[FORMAT](name, K, N, w.dim_size(0), w.dim_size(1), d.dim_size(0), d.dim_size(1))
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
