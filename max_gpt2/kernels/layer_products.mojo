# The four products of a GPT-2 block as gpt2_decode_layer runs them: each a weight in float32,
# bfloat16 or a block format (bytes: q8_0, q4_0, the other blocks of 32 and the K-quants:
# packed_layout.mojo), its bias, and the
# chunks its outputs are cut into, run through the standalone products' own loops with an
# epilogue (epilogue.mojo).
from extensibility import InputTensor
from std.memory import UnsafePointer

from .packed_layout import F32, GROUP, activation_of, check_bias, check_blocks, check_chunks, check_dense, row_chunks
from .phases import chunk_span
from .quantized_matmul import block_groups
from .quantized_rows import QuantizedRows
from .dense_rows import PASS_ROWS, dense_rows


struct Product[WT: DType, FORMAT: Int](ImplicitlyCopyable):
    """One of the layer's products, y [rows, N] = x [rows, K] @ W^T + bias, W stored in FORMAT (a block
    format of packed_layout.mojo), or for FORMAT 0 as rows of WT (float32 or bfloat16)."""

    var w: Int  # addresses: the weight, its block scales (block formats) and the bias
    var scales: Int
    var bias: Int
    var has_bias: Bool
    var K: Int
    var N: Int

    def __init__(out self, w: Int, scales: Int, bias: Int, has_bias: Bool, K: Int, N: Int):
        comptime assert (Self.FORMAT == 0 and (Self.WT == F32 or Self.WT == DType.bfloat16)) or (Self.FORMAT != 0 and Self.WT == DType.uint8), "a block format's weight is bytes, a row format's float32 or bfloat16"
        self.w, self.scales, self.bias, self.has_bias, self.K, self.N = w, scales, bias, has_bias, K, N

    def units(self) -> Int:
        """What a chunk is made of: groups of 8 outputs (packed blocks) or `PASS_ROWS` outputs (float rows)."""
        comptime if Self.FORMAT != 0:
            return (self.N + GROUP - 1) // GROUP
        return (self.N + PASS_ROWS - 1) // PASS_ROWS

    def chunks(self) -> Int:
        """One chunk of outputs a core, claimed one at a time, so a thread that arrives late finds its
        share taken. Each thread then streams one run of W, as fast as or faster than more chunks
        (docs/performance.md)."""
        return min(self.units(), row_chunks())

    def run[
        X: Int, //, EPILOGUE: Int
    ](
        self,
        x: UnsafePointer[Float32, ImmutAnyOrigin],
        xq: QuantizedRows[X],
        y: UnsafePointer[Float32, MutAnyOrigin],
        rows: Int,
        chunk: Int,
    ):
        """Chunk `chunk` of `chunks()` of the outputs, from x (float formats) or xq (block formats, x
        rounded as `activation_of` says)."""
        var first, last = chunk_span(chunk, self.chunks(), self.units())
        var bias = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=self.bias)
        comptime if Self.FORMAT != 0:
            var w = UnsafePointer[UInt8, ImmutAnyOrigin](unsafe_from_address=self.w)
            var d = UnsafePointer[Float16, ImmutAnyOrigin](unsafe_from_address=self.scales)
            block_groups[Self.FORMAT, EPILOGUE](w, d, xq, bias, self.has_bias, y, rows, self.N, first, last)
        else:
            var w = UnsafePointer[Scalar[Self.WT], ImmutAnyOrigin](unsafe_from_address=self.w)
            dense_rows[Self.WT, EPILOGUE](x, w, bias, self.has_bias, y, rows, self.K, self.N, first * PASS_ROWS, min(last * PASS_ROWS, self.N))


def checked_product[
    WT: DType, FORMAT: Int
](
    name: String,
    w: InputTensor[dtype=WT, rank=2, ...],
    scales: InputTensor[dtype=DType.float16, rank=2, ...],
    bias: InputTensor[dtype=F32, rank=1, ...],
    K: Int,
    N: Int,
) raises -> Product[WT, FORMAT]:
    """A product's tensors checked against its K inputs and N outputs."""
    comptime if FORMAT != 0:
        check_blocks[FORMAT](name, K, N, w.dim_size(0), w.dim_size(1), scales.dim_size(0), scales.dim_size(1))
        check_dense(name, scales.dim_size(0), scales.dim_size(1), scales.stride_length(0), scales.stride_length(1))
    elif WT == F32:
        if w.dim_size(0) != N or w.dim_size(1) != K:
            raise Error(name, ": the weight is [", w.dim_size(0), ", ", w.dim_size(1), "]; the layer needs [", N, ", ", K, "]")
    else:
        check_chunks(name, K, N, w.dim_size(0), w.dim_size(1))
    check_dense(name, w.dim_size(0), w.dim_size(1), w.stride_length(0), w.stride_length(1))
    check_bias(name, N, bias.dim_size(0), bias.stride_length(0))
    return Product[WT, FORMAT](Int(w.unsafe_ptr()), Int(scales.unsafe_ptr()), Int(bias.unsafe_ptr()), bias.dim_size(0) == N, K, N)
