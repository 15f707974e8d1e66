# skinny_matmul: y[M, N] = x[M, K] @ W[N, K]^T on the CPU, float32, for a few rows of x.
#
# What `Linear` computes without its bias (W stored [out, in]), shaped for decoding:
# M (batch x new tokens) is small, so the product is memory bound and W should be
# read from memory once, whatever M is. The N rows of W are split into equal
# chunks, one per task; a task walks its chunk 24 rows at a time, and dots those
# with every row of x (X_ROWS at once) while they are in cache, a block of RB rows
# at a time, every partial sum in a register (MB x RB accumulators of a vector
# register's lanes).
import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.collections import Array
from std.memory import UnsafePointer
from std.sys.info import CompilationTarget, simd_width_of
from std.sys.intrinsics import PrefetchOptions, prefetch

comptime F32 = DType.float32
# One register's float32 lanes: 16 on AVX-512, 8 on AVX2, where 16 spilled the accumulators
# (batch 8 ran 1.5x slower on a 2-core AVX2 EPYC).
comptime LANES = simd_width_of[F32]()
# Elements of W requested into L2 ahead of the loads (64 KB: 16 KB left the 49 products of a
# GPT-2 small step 4 % slower, 128 KB as slow again).
comptime PREFETCH_AHEAD = 16384
# Rows of x a block of W dots at once: on AVX2, 4 x-rows by 3 W-rows fill the 16 registers
# (8 by 1 were 3 % slower at batch 8).
comptime X_ROWS = 8 if CompilationTarget.has_avx512f() else 4
comptime TASKS = 8  # chunks of W's rows, when the work is worth more than one thread
comptime SERIAL_BELOW = 1 << 20  # multiply-adds (N * K * rows) under which one thread does it all


def w_rows[MB: Int]() -> Int:
    """Rows of W a block dots with MB rows of x: MB x RB accumulators, the RB rows and x in the
    vector registers (32 on AVX-512, 16 on AVX2), RB dividing 24 (also packed_matmul_bf16's)."""
    comptime if CompilationTarget.has_avx512f():
        return 3 if MB > 4 else (4 if MB > 2 else 8)
    else:
        return 3 if MB > 2 else (4 if MB == 2 else 8)


@always_inline
def _block[
    MB: Int, RB: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    n: Int,
):
    """Y[m, n + r] for m < MB, r < RB; x and y point at the group's first row."""
    var acc = Array[SIMD[F32, LANES], MB * RB](fill=SIMD[F32, LANES](0))
    var vector_end = K // LANES * LANES
    var k = 0
    while k < vector_end:
        var rows = Array[SIMD[F32, LANES], RB](uninitialized=True)
        comptime for r in range(RB):
            rows[r] = (w + (n + r) * K + k).load[width=LANES]()
            prefetch[PrefetchOptions().for_read().low_locality()](w + (n + r) * K + k + PREFETCH_AHEAD)
        comptime for m in range(MB):
            var xv = (x + m * K + k).load[width=LANES]()
            comptime for r in range(RB):
                acc[m * RB + r] = rows[r].fma(xv, acc[m * RB + r])
        k += LANES
    comptime for m in range(MB):
        comptime for r in range(RB):
            var total = acc[m * RB + r].reduce_add()
            for tail in range(vector_end, K):
                total += w[(n + r) * K + tail] * x[m * K + tail]
            y[m * N + n + r] = total


@always_inline
def _rows[
    MB: Int, RB: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    first: Int,
    end: Int,
):
    """Rows first..end-1 of W against MB consecutive rows of x."""
    var n = first
    while n + RB <= end:
        _block[MB, RB](x, w, y, K, N, n)
        n += RB
    while n < end:
        _block[MB, 1](x, w, y, K, N, n)
        n += 1


def skinny_matmul(
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
):
    """Y = x @ W^T for dense row-major x [M, K], W [N, K], y [M, N]."""
    # Chunks a multiple of 24 rows, so every block size (8, 4, 3) tiles them.
    var chunk = ((N + TASKS - 1) // TASKS + 23) // 24 * 24
    var tasks = (N + chunk - 1) // chunk

    def work(task: Int) {imm x, imm w, imm y, imm M, imm K, imm N, imm chunk}:
        # 24 rows of W at a time, against every row of x while they are in cache (past 8 rows
        # of x a chunk no longer fits the cache by the second pass).
        var first = task * chunk
        var chunk_end = min(first + chunk, N)
        while first < chunk_end:
            var end = min(first + 24, chunk_end)
            var m = 0
            while m < M:  # groups of up to X_ROWS rows of x; fewer rows leave registers for more rows of W
                var left = min(M - m, X_ROWS)
                var xm = x + m * K
                var ym = y + m * N
                if left >= 8:
                    _rows[8, w_rows[8]()](xm, w, ym, K, N, first, end)
                elif left == 7:
                    _rows[7, w_rows[7]()](xm, w, ym, K, N, first, end)
                elif left == 6:
                    _rows[6, w_rows[6]()](xm, w, ym, K, N, first, end)
                elif left == 5:
                    _rows[5, w_rows[5]()](xm, w, ym, K, N, first, end)
                elif left == 4:
                    _rows[4, w_rows[4]()](xm, w, ym, K, N, first, end)
                elif left == 3:
                    _rows[3, w_rows[3]()](xm, w, ym, K, N, first, end)
                elif left == 2:
                    _rows[2, w_rows[2]()](xm, w, ym, K, N, first, end)
                else:
                    _rows[1, w_rows[1]()](xm, w, ym, K, N, first, end)
                m += left
            first = end

    # Waking the other threads costs more than a small product gains from them.
    if tasks == 1 or N * K * M < SERIAL_BELOW:
        for task in range(tasks):
            work(task)
    else:
        sync_parallelize(work, tasks)


@extensibility.register("skinny_matmul")
struct SkinnyMatmul:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=F32, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "skinny_matmul runs on the CPU"
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = w.dim_size(0)
        if w.dim_size(1) != K or y.dim_size(0) != M or y.dim_size(1) != N:
            raise Error("skinny_matmul: x [M, K], W [N, K] and y [M, N] disagree")
        for t in [x.stride_length(1), w.stride_length(1), y.stride_length(1)]:
            if t != 1:
                raise Error("skinny_matmul: expects dense row-major tensors")
        if x.stride_length(0) != K or w.stride_length(0) != K or y.stride_length(0) != N:
            raise Error("skinny_matmul: expects dense row-major tensors")
        skinny_matmul(
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr())),
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(w.unsafe_ptr())),
            UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr())),
            M,
            K,
            N,
        )
