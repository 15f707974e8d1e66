# GPT-2's layer norm over rows of float32, for gpt2_decode_layer (one thread: a few rows of D).
# Each sum runs in a register's lanes: summed one value at a time, a 768-wide row is two chains
# of 768 dependent adds, a noticeable part of a packed layer's time.
from std.math import sqrt
from std.memory import UnsafePointer
from std.sys.info import simd_width_of

comptime LANES = simd_width_of[DType.float32]()


def layer_norm(
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    weight: UnsafePointer[Float32, ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    epsilon: Float32,
    y: UnsafePointer[Float32, MutAnyOrigin],
    rows: Int,
    D: Int,
):
    """y [rows, D] = (x - mean) / sqrt(variance + epsilon) * weight + bias, row by row (variance over D)."""
    var vector_end = D // LANES * LANES
    for m in range(rows):
        var row = x + m * D
        var out = y + m * D
        var sums = SIMD[DType.float32, LANES](0)
        for i in range(0, vector_end, LANES):
            sums += (row + i).load[width=LANES]()
        var total = sums.reduce_add()
        for i in range(vector_end, D):
            total += row[i]
        var mean = total / Float32(D)
        var squares = SIMD[DType.float32, LANES](0)
        for i in range(0, vector_end, LANES):
            var centered = (row + i).load[width=LANES]() - mean
            squares = centered.fma(centered, squares)
        var square_total = squares.reduce_add()
        for i in range(vector_end, D):
            square_total += (row[i] - mean) * (row[i] - mean)
        var inverse = 1 / sqrt(square_total / Float32(D) + epsilon)
        for i in range(0, vector_end, LANES):
            var normed = ((row + i).load[width=LANES]() - mean) * inverse
            (out + i).store(normed.fma((weight + i).load[width=LANES](), (bias + i).load[width=LANES]()))
        for i in range(vector_end, D):
            out[i] = (row[i] - mean) * inverse * weight[i] + bias[i]
