# gpt2_dequantize: weights in a block format (its code a parameter: packed_layout.mojo) back to
# float32 [N, K], for the graphs that multiply them with MAX's matmul (prompts, attention maps).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.memory import UnsafePointer

from .packed_layout import F32, GROUP, NIBBLES, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, block_bytes, block_scales, block_weights, check_blocks, check_dense, fifth_bits_at, has_fifth_bits, is_super, row_chunks, scales_at


@always_inline
def _value[
    FORMAT: Int
](block: UnsafePointer[UInt8, ImmutAnyOrigin], steps: UnsafePointer[Float16, ImmutAnyOrigin], r: Int, e: Int) -> Float32:
    """Weight e of row r of a group's block (super-block), `steps` its float16 scales, in llama.cpp's
    order of float32 operations."""
    var step = steps[r].cast[F32]()
    comptime if FORMAT == Q8_0:
        return Float32(block.bitcast[Int8]()[(e // 4) * 32 + r * 4 + e % 4]) * step
    var j, half, c, within = e // 32, (e % 32) // 16, (e % 16) // 4, e % 4
    var q = Int((block[j * 128 + c * 32 + r * 4 + within] >> UInt8(4 * half)) & 0xF)
    comptime if has_fifth_bits[FORMAT]():
        q |= Int((block[fifth_bits_at[FORMAT]() + j * 32 + r * 4 + within] >> UInt8(4 * half + c)) & 1) << 4
    comptime if FORMAT == Q4_0:
        return Float32(q - 8) * step
    elif FORMAT == Q5_0:
        return Float32(q - 16) * step
    elif not is_super[FORMAT]():  # q4_1, q5_1
        return Float32(q) * step + steps[GROUP + r].cast[F32]()
    elif FORMAT == Q6_K:
        var top = block[NIBBLES + j * 64 + (c % 2) * 32 + r * 4 + within]
        q |= Int((top >> UInt8(4 * (1 - c // 2) + 2 * half)) & 3) << 4
        var scale = Float32(Int(block.bitcast[Int8]()[scales_at[FORMAT]() + (2 * j + half) * 8 + r]))
        return (step * scale) * Float32(q - 32)
    else:
        var scaled = step * Float32(Int(block[scales_at[FORMAT]() + j * 8 + r]))
        var offset = steps[GROUP + r].cast[F32]() * Float32(Int(block[scales_at[FORMAT]() + 64 + j * 8 + r]))
        return scaled * Float32(q) - offset


def dequantize[
    FORMAT: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    result: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
):
    """result [N, K] float32 = W's values times their scales, the padding rows and columns left out."""
    comptime BYTES = block_bytes[FORMAT]()
    comptime WEIGHTS = block_weights[FORMAT]()
    comptime SCALES = block_scales[FORMAT]()
    var nb = (K + WEIGHTS - 1) // WEIGHTS
    var groups = (N + GROUP - 1) // GROUP
    var chunk = (groups + row_chunks() - 1) // row_chunks()

    def work(task: Int) {imm w, imm d, imm result, imm K, imm N, imm nb, imm groups, imm chunk}:
        for g in range(task * chunk, min((task + 1) * chunk, groups)):
            for b in range(nb):
                var block = w + (g * nb + b) * BYTES
                var steps = d + (g * nb + b) * SCALES
                for r in range(min(GROUP, N - g * GROUP)):
                    var row = result + (g * GROUP + r) * K + b * WEIGHTS
                    for e in range(min(WEIGHTS, K - b * WEIGHTS)):
                        row[e] = _value[FORMAT](block, steps, r, e)

    sync_parallelize(work, (groups + chunk - 1) // chunk)


@always_inline
def _execute_dequantize[
    FORMAT: Int, name: StaticString
](
    result: OutputTensor[dtype=F32, rank=2, ...],
    w: InputTensor[rank=2, ...],
    d: InputTensor[dtype=DType.float16, rank=2, ...],
) raises:
    var N, K = result.dim_size(0), result.dim_size(1)
    check_blocks[FORMAT](name, K, N, w.dim_size(0), w.dim_size(1), d.dim_size(0), d.dim_size(1))
    check_dense(name, w.dim_size(0), w.dim_size(1), w.stride_length(0), w.stride_length(1))
    check_dense(name, d.dim_size(0), d.dim_size(1), d.stride_length(0), d.stride_length(1))
    check_dense(name, N, K, result.stride_length(0), result.stride_length(1))
    dequantize[FORMAT](
        UnsafePointer[UInt8, ImmutAnyOrigin](unsafe_from_address=Int(w.unsafe_ptr())),
        UnsafePointer[Float16, ImmutAnyOrigin](unsafe_from_address=Int(d.unsafe_ptr())),
        UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(result.unsafe_ptr())),
        K,
        N,
    )


@extensibility.register("gpt2_dequantize")
struct Dequantize:
    """W in a block format (`format`, packed_layout.mojo's code) -> float32 [N, K]."""

    @staticmethod
    def execute[
        target: StaticString,
        format: Int,
    ](
        result: OutputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        d: InputTensor[dtype=DType.float16, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_dequantize runs on the CPU"
        comptime assert format != 0, "gpt2_dequantize unpacks a block format; rows of floats need none"
        _execute_dequantize[format, "gpt2_dequantize"](result, w, d)
