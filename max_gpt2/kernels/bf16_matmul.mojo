# packed_matmul_bf16: y[M, N] = x[M, K] @ W[N, K]^T on the CPU, W bfloat16 (2 bytes a weight).
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
from std.sys.intrinsics import PrefetchOptions, prefetch

from .packed_layout import F32, PREFETCH_AHEAD, SERIAL_BELOW, check_dense, row_chunks

comptime LANES = 16  # float32 lanes


@always_inline
def _group_bf16[
    MB: Int, RB: Int
](
    w: UnsafePointer[BFloat16, ImmutAnyOrigin],
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    m0: Int,
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    n: Int,
):
    """y[m0 + m, n + r] for m < MB, r < RB, W bfloat16 widened to float32."""
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
            y[(m0 + m) * N + n + r] = total


def packed_matmul_bf16(
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[BFloat16, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
):
    """Y = x @ W^T for dense row-major x [M, K], W bfloat16 [N, K], y [M, N]."""
    # Chunks a multiple of 24 rows, so every group size (8, 4, 3) tiles them.
    var chunk = ((N + row_chunks() - 1) // row_chunks() + 23) // 24 * 24
    var tasks = (N + chunk - 1) // chunk

    def work(task: Int) {imm x, imm w, imm y, imm M, imm K, imm N, imm chunk}:
        var first = task * chunk
        var end = min(first + chunk, N)
        var m = 0
        while m < M:  # groups of up to 8 rows of x; fewer rows leave registers for more rows of W
            var left = M - m
            var rows = 8 if left >= 8 else (4 if left >= 4 else left)
            var n = first
            var group = 8 if rows == 1 else (4 if rows <= 4 else 1)
            while n + group <= end:
                if rows == 8:
                    _group_bf16[8, 1](w, x, m, y, K, N, n)
                elif rows == 4:
                    _group_bf16[4, 4](w, x, m, y, K, N, n)
                elif rows == 3:
                    _group_bf16[3, 4](w, x, m, y, K, N, n)
                elif rows == 2:
                    _group_bf16[2, 4](w, x, m, y, K, N, n)
                else:
                    _group_bf16[1, 8](w, x, m, y, K, N, n)
                n += group
            while n < end:
                if rows == 8:
                    _group_bf16[8, 1](w, x, m, y, K, N, n)
                elif rows == 4:
                    _group_bf16[4, 1](w, x, m, y, K, N, n)
                elif rows == 3:
                    _group_bf16[3, 1](w, x, m, y, K, N, n)
                elif rows == 2:
                    _group_bf16[2, 1](w, x, m, y, K, N, n)
                else:
                    _group_bf16[1, 1](w, x, m, y, K, N, n)
                n += 1
            m += rows

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
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "packed_matmul_bf16 runs on the CPU"
        var M, K, N = x.dim_size(0), x.dim_size(1), w.dim_size(0)
        if w.dim_size(1) != K or y.dim_size(0) != M or y.dim_size(1) != N:
            raise Error("packed_matmul_bf16: x [M, K], W [N, K] and y [M, N] disagree")
        check_dense("packed_matmul_bf16", M, K, x.stride_length(0), x.stride_length(1))
        check_dense("packed_matmul_bf16", N, K, w.stride_length(0), w.stride_length(1))
        check_dense("packed_matmul_bf16", M, N, y.stride_length(0), y.stride_length(1))
        packed_matmul_bf16(
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr())),
            UnsafePointer[BFloat16, ImmutAnyOrigin](unsafe_from_address=Int(w.unsafe_ptr())),
            UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr())),
            M,
            K,
            N,
        )
