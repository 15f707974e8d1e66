# The products of rows of floats (gpt2_matmul's with format 0, products.mojo): y[M, N] = x[M, K] @
# W[N, K]^T + bias[N] on the CPU, for a few rows of x, W float32 or bfloat16 (an empty bias is none).
#
# What `Linear` computes (W stored [out, in]), shaped for decoding: M (batch x new tokens) is
# small, so the product is memory bound and W should be read from memory once, whatever M is.
# The N rows of W are split into equal chunks, one per task, and each task runs dense_rows.mojo's
# loops over its chunk.
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from std.memory import UnsafePointer

from .dense_rows import PASS_ROWS, dense_rows
from .epilogue import STORE
from .packed_layout import F32, SERIAL_BELOW, check_bias, check_chunks, check_dense, row_chunks

# Multiply-adds (N * K * rows) under which one thread does float32: 1 << 20 left GPT-2 small's
# 768 x 768 c_proj on one thread at batch 1, and its step slower.
comptime F32_SERIAL_BELOW = 1 << 19


def chunks_of[WT: DType](M: Int, K: Int, N: Int) -> Int:
    """Chunks of W's rows a product is split into: one a core (`row_chunks`), or 1 where this thread
    does it all (waking the others costs more than a small product gains): float32 below 1 << 19
    multiply-adds, bfloat16 below `SERIAL_BELOW` bytes. One chunk a core is as fast as or faster
    than more (docs/performance.md)."""
    var small = N * K * M < F32_SERIAL_BELOW if WT == F32 else N * K * 2 < SERIAL_BELOW
    return 1 if small else row_chunks()


def dense_matmul[
    WT: DType
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[Scalar[WT], ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
):
    """Y = x @ W^T (+ bias [N]) for dense row-major x [M, K] and y [M, N]; W float32 [N, K] or
    bfloat16 in groups (packed_layout.mojo)."""
    var tasks = chunks_of[WT](M, K, N)
    # Chunks a multiple of `PASS_ROWS`, so every block size (8, 4, 3, 1) tiles them.
    var chunk = ((N + tasks - 1) // tasks + PASS_ROWS - 1) // PASS_ROWS * PASS_ROWS
    tasks = (N + chunk - 1) // chunk

    def work(task: Int) {imm x, imm w, imm bias, imm has_bias, imm y, imm M, imm K, imm N, imm chunk}:
        dense_rows[WT, STORE](x, w, bias, has_bias, y, M, K, N, task * chunk, min((task + 1) * chunk, N))

    if tasks == 1:
        work(0)
    else:
        sync_parallelize(work, tasks)


@always_inline
def execute_rows[
    WT: DType, name: StaticString
](
    y: OutputTensor[dtype=F32, rank=2, ...],
    x: InputTensor[dtype=F32, rank=2, ...],
    w: InputTensor[dtype=WT, rank=2, ...],
    bias: InputTensor[dtype=F32, rank=1, ...],
) raises:
    var M, K, N = x.dim_size(0), x.dim_size(1), y.dim_size(1)
    comptime if WT == F32:
        if w.dim_size(0) != N or w.dim_size(1) != K or y.dim_size(0) != M:
            raise Error(name, ": x [", M, ", ", K, "], W [", w.dim_size(0), ", ", w.dim_size(1), "] and y [", y.dim_size(0), ", ", N, "] disagree")
    else:
        if y.dim_size(0) != M:
            raise Error(name, ": x has ", M, " rows and y ", y.dim_size(0))
        check_chunks(name, K, N, w.dim_size(0), w.dim_size(1))
    check_dense(name, M, K, x.stride_length(0), x.stride_length(1))
    check_dense(name, w.dim_size(0), w.dim_size(1), w.stride_length(0), w.stride_length(1))
    check_dense(name, M, N, y.stride_length(0), y.stride_length(1))
    check_bias(name, N, bias.dim_size(0), bias.stride_length(0))
    dense_matmul[WT](
        UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr())),
        UnsafePointer[Scalar[WT], ImmutAnyOrigin](unsafe_from_address=Int(w.unsafe_ptr())),
        UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(bias.unsafe_ptr())),
        bias.dim_size(0) == N,
        UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr())),
        M,
        K,
        N,
    )
