# GPT-2's layer norm over rows of float32, for gpt2_decode_layer (one thread: a few rows of D).
from std.math import sqrt
from std.memory import UnsafePointer


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
    for m in range(rows):
        var row = x + m * D
        var total = Float32(0)
        for i in range(D):
            total += row[i]
        var mean = total / Float32(D)
        var squares = Float32(0)
        for i in range(D):
            squares += (row[i] - mean) * (row[i] - mean)
        var inverse = 1 / sqrt(squares / Float32(D) + epsilon)
        for i in range(D):
            y[m * D + i] = (row[i] - mean) * inverse * weight[i] + bias[i]
