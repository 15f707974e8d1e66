# packed_matmul_bf16: y[M, N] = x[M, K] @ W[N, K]^T + bias[N] on the CPU, W bfloat16 (2 bytes a
# weight); an empty bias is none.
#
# Decoding reads every weight once per step, so its speed is bytes of weights over memory
# bandwidth: W is read as bfloat16, widened to float32 in registers (exact: the top half of
# a float32) and multiplied and added in float32, like `skinny_matmul`.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.collections import Array
from std.memory import UnsafePointer
from std.sys.info import simd_width_of
from std.sys.intrinsics import PrefetchOptions, prefetch

from .packed_layout import F32, SERIAL_BELOW, check_bias, check_dense, row_chunks
from .skinny_matmul import X_ROWS, w_rows

comptime LANES = simd_width_of[F32]()  # one register's float32 lanes (more spill the accumulators)
# Elements of W requested into L2 ahead of the loads: 64 KB (16 KB left a step's products 10 % slower).
comptime PREFETCH_AHEAD = 32768


@always_inline
def _group_bf16[
    MB: Int, RB: Int
](
    w: UnsafePointer[BFloat16, ImmutAnyOrigin],
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    m0: Int,
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    n: Int,
):
    """y[m0 + m, n + r] for m < MB, r < RB, W bfloat16 widened to float32, plus bias[n + r] if any."""
    var acc = Array[SIMD[F32, LANES], MB * RB](fill=SIMD[F32, LANES](0))
    var vector_end = K // LANES * LANES
    var k = 0
    while k < vector_end:
        var rows = Array[SIMD[F32, LANES], RB](uninitialized=True)
        comptime for r in range(RB):
            rows[r] = (w + (n + r) * K + k).load[width=LANES]().cast[F32]()
            prefetch[PrefetchOptions().for_read().low_locality()](w + (n + r) * K + k + PREFETCH_AHEAD)
        comptime for m in range(MB):
            var xv = (x + (m0 + m) * K + k).load[width=LANES]()
            comptime for r in range(RB):
                acc[m * RB + r] = rows[r].fma(xv, acc[m * RB + r])
        k += LANES
    comptime for m in range(MB):
        comptime for r in range(RB):
            var total = acc[m * RB + r].reduce_add()
            for tail in range(vector_end, K):
                total += w[(n + r) * K + tail].cast[F32]() * x[(m0 + m) * K + tail]
            y[(m0 + m) * N + n + r] = total + bias[n + r] if has_bias else total


@always_inline
def _rows_bf16[
    MB: Int, RB: Int
](
    w: UnsafePointer[BFloat16, ImmutAnyOrigin],
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    m0: Int,
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    first: Int,
    end: Int,
):
    """Rows first..end-1 of W against rows m0..m0+MB-1 of x."""
    var n = first
    while n + RB <= end:
        _group_bf16[MB, RB](w, x, m0, bias, has_bias, y, K, N, n)
        n += RB
    while n < end:
        _group_bf16[MB, 1](w, x, m0, bias, has_bias, y, K, N, n)
        n += 1


def packed_matmul_bf16(
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[BFloat16, ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
):
    """Y = x @ W^T (+ bias [N]) for dense row-major x [M, K], W bfloat16 [N, K], y [M, N]."""
    # Chunks a multiple of 24 rows, so every group size (8, 4, 3) tiles them.
    var chunk = ((N + row_chunks() - 1) // row_chunks() + 23) // 24 * 24
    var tasks = (N + chunk - 1) // chunk

    def work(task: Int) {imm x, imm w, imm bias, imm has_bias, imm y, imm M, imm K, imm N, imm chunk}:
        var first = task * chunk
        var chunk_end = min(first + chunk, N)
        while first < chunk_end:  # 24 rows of W against every row of x while they are in cache
            var end = min(first + 24, chunk_end)
            var m = 0
            while m < M:
                var rows = min(M - m, X_ROWS)
                if rows >= 8:
                    _rows_bf16[8, w_rows[8]()](w, x, m, bias, has_bias, y, K, N, first, end)
                elif rows == 7:
                    _rows_bf16[7, w_rows[7]()](w, x, m, bias, has_bias, y, K, N, first, end)
                elif rows == 6:
                    _rows_bf16[6, w_rows[6]()](w, x, m, bias, has_bias, y, K, N, first, end)
                elif rows == 5:
                    _rows_bf16[5, w_rows[5]()](w, x, m, bias, has_bias, y, K, N, first, end)
                elif rows == 4:
                    _rows_bf16[4, w_rows[4]()](w, x, m, bias, has_bias, y, K, N, first, end)
                elif rows == 3:
                    _rows_bf16[3, w_rows[3]()](w, x, m, bias, has_bias, y, K, N, first, end)
                elif rows == 2:
                    _rows_bf16[2, w_rows[2]()](w, x, m, bias, has_bias, y, K, N, first, end)
                else:
                    _rows_bf16[1, w_rows[1]()](w, x, m, bias, has_bias, y, K, N, first, end)
                m += rows
            first = end

    if tasks == 1 or N * K * 2 < SERIAL_BELOW:
        for task in range(tasks):
            work(task)
    else:
        sync_parallelize(work, tasks)


@extensibility.register("packed_matmul_bf16")
struct PackedMatmulBF16:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=DType.bfloat16, rank=2, ...],
        bias: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "packed_matmul_bf16 runs on the CPU"
        var M, K, N = x.dim_size(0), x.dim_size(1), w.dim_size(0)
        if w.dim_size(1) != K or y.dim_size(0) != M or y.dim_size(1) != N:
            raise Error("packed_matmul_bf16: x [M, K], W [N, K] and y [M, N] disagree")
        check_dense("packed_matmul_bf16", M, K, x.stride_length(0), x.stride_length(1))
        check_dense("packed_matmul_bf16", N, K, w.stride_length(0), w.stride_length(1))
        check_dense("packed_matmul_bf16", M, N, y.stride_length(0), y.stride_length(1))
        check_bias("packed_matmul_bf16", N, bias.dim_size(0), bias.stride_length(0))
        packed_matmul_bf16(
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr())),
            UnsafePointer[BFloat16, ImmutAnyOrigin](unsafe_from_address=Int(w.unsafe_ptr())),
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(bias.unsafe_ptr())),
            bias.dim_size(0) == N,
            UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr())),
            M,
            K,
            N,
        )
