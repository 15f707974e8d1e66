# How a product's kernels write y: as it is, added to what y holds (a residual connection), or
# through GPT-2's GELU (its tanh approximation, Hugging Face's "gelu_new"). The products that stand
# alone store; gpt2_decode_layer adds and applies GELU as it writes, instead of an op each (GELU,
# after float32 and bfloat16 passes, over the pass's columns once written: `gelu_columns`).
from std.collections import Array
from std.math import tanh
from std.memory import UnsafePointer

comptime STORE = 0
comptime ADD = 1
comptime GELU = 2

comptime _SQRT_2_OVER_PI = 0.7978845608028654


@always_inline
def gelu_tanh[width: Int](x: SIMD[DType.float32, width]) -> SIMD[DType.float32, width]:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1 + tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


@always_inline
def finish[EPILOGUE: Int, width: Int](y: UnsafePointer[Float32, MutAnyOrigin], value: SIMD[DType.float32, width]):
    """Writes `value` (bias included) at y as EPILOGUE says: STORE, ADD to y, or GELU of it."""
    comptime if EPILOGUE == ADD:
        y.store(y.load[width=width]() + value)
    elif EPILOGUE == GELU:
        y.store(gelu_tanh[width](value))
    else:
        y.store(value)


def gelu_columns[W: Int](y: UnsafePointer[Float32, MutAnyOrigin], M: Int, N: Int, start: Int, end: Int):
    """GELU of y[m, start:end] for m < M, in place, W values at a time: GELU after the products that
    wrote those columns, instead of a value at a time as each is written."""
    for m in range(M):
        var row = y + m * N
        var n = start
        while n + W <= end:
            (row + n).store(gelu_tanh[W]((row + n).load[width=W]()))
            n += W
        for rest in range(n, end):
            row[rest] = gelu_tanh[1](row[rest])


@always_inline
def finish_rows[
    EPILOGUE: Int, L: Int, MB: Int
](
    acc: Array[SIMD[DType.float32, L], MB],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    m0: Int,
    N: Int,
    first: Int,
):
    """y[m0 + m, first + r] for m < MB, r < L (those below N) from acc[m][r], plus bias[first + r]
    where there is a bias, as EPILOGUE says (`finish`): a block product's outputs written."""
    var rows = min(L, N - first)
    var offsets = SIMD[DType.float32, L](0)
    if has_bias:
        for r in range(rows):
            offsets[r] = bias[first + r]
    comptime for m in range(MB):
        var out = y + (m0 + m) * N + first
        if rows == L:
            finish[EPILOGUE, L](out, acc[m] + offsets)
        else:
            for r in range(rows):
                finish[EPILOGUE, 1](out + r, acc[m][r] + offsets[r])
