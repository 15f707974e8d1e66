# gpt2_paged_decode_layer: gpt2_decode_layer for a server's decoding step, over MAX's paged KV cache
# (CPU; float32 activations and cache; weights as gpt2_decode_layer takes them):
#
#     x                  [R * S, D]  S new tokens of each of R requests, end to end (S = 1 but for a
#                                    step checking drafted tokens)
#     kv_blocks          [pages, 2, L, page_size, H, d]   MAX's cache, written in place
#     cache_lengths      [R]         tokens request r had cached before this step
#     lookup_table       [R, P]      request r's token p lives on page lookup_table[r, p // page_size]
#     input_row_offsets  [R + 1]     must be 0, S, 2S, ..., R * S: as many tokens each request
#     page_stride        [1]         elements from one page to the next; -1: pages packed end to end
#     layer              [1]         which layer's keys and values these are
#     ln_1, ln_2, epsilon, the four products: as gpt2_decode_layer takes them
#     -> y               [R * S, D]  the block's output
#
# The block's phases are gpt2_decode_layer's; only where a request's keys and values lie differs
# (layer_kv.mojo), as gpt2_paged_attention finds them.
import extensibility
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice, OutputTensor
from max.gpu.host import DeviceContext
from std.memory import UnsafePointer

from .attend import ROW
from .decode_layer import checked_layer, decode_layer
from .layer_kv import paged_layer_kv
from .packed_layout import F32

comptime U32 = DType.uint32


@extensibility.register("gpt2_paged_decode_layer")
struct PagedDecodeLayer:
    @staticmethod
    def execute[
        target: StaticString,
        weight_dtype: DType,
        qkv_format: Int,
        out_format: Int,
        fc_format: Int,
        down_format: Int,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        kv_blocks: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=F32, rank=6, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        cache_lengths: InputTensor[dtype=U32, rank=1, ...],
        lookup_table: InputTensor[dtype=U32, rank=2, ...],
        input_row_offsets: InputTensor[dtype=U32, rank=1, ...],
        page_stride: InputTensor[dtype=DType.int64, rank=1, ...],
        layer: InputTensor[dtype=U32, rank=1, ...],
        ln_1_weight: InputTensor[dtype=F32, rank=1, ...],
        ln_1_bias: InputTensor[dtype=F32, rank=1, ...],
        ln_2_weight: InputTensor[dtype=F32, rank=1, ...],
        ln_2_bias: InputTensor[dtype=F32, rank=1, ...],
        epsilon: InputTensor[dtype=F32, rank=1, ...],
        qkv_w: InputTensor[dtype=weight_dtype, rank=2, ...],
        qkv_scales: InputTensor[dtype=DType.float16, rank=2, ...],
        qkv_bias: InputTensor[dtype=F32, rank=1, ...],
        out_w: InputTensor[dtype=weight_dtype, rank=2, ...],
        out_scales: InputTensor[dtype=DType.float16, rank=2, ...],
        out_bias: InputTensor[dtype=F32, rank=1, ...],
        fc_w: InputTensor[dtype=weight_dtype, rank=2, ...],
        fc_scales: InputTensor[dtype=DType.float16, rank=2, ...],
        fc_bias: InputTensor[dtype=F32, rank=1, ...],
        down_w: InputTensor[dtype=weight_dtype, rank=2, ...],
        down_scales: InputTensor[dtype=DType.float16, rank=2, ...],
        down_bias: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_paged_decode_layer runs on the CPU"
        var H, d = kv_blocks.dim_size(4), kv_blocks.dim_size(5)
        var T, D, R = x.dim_size(0), x.dim_size(1), cache_lengths.dim_size(0)
        if H * d != D or y.dim_size(0) != T or y.dim_size(1) != D:
            raise Error("gpt2_paged_decode_layer: x [", T, ", ", D, "], y [", y.dim_size(0), ", ", y.dim_size(1), "] and the cache's ", H, " heads of ", d, " disagree")
        if input_row_offsets.dim_size(0) != R + 1:
            raise Error("gpt2_paged_decode_layer: cache_lengths speak of ", R, " requests, the row offsets of ", input_row_offsets.dim_size(0) - 1)
        if R == 0 or T % R != 0:
            raise Error("gpt2_paged_decode_layer: ", T, " tokens are not the same number for each of ", R, " requests")
        var S = T // R
        for r in range(R + 1):
            if Int(input_row_offsets[r]) != r * S:
                raise Error("gpt2_paged_decode_layer: request ", r, " starts at token ", Int(input_row_offsets[r]), ", not ", r * S, ": the step's ", T, " tokens are ", S, " a request")
        var kv = paged_layer_kv("gpt2_paged_decode_layer", kv_blocks, cache_lengths, lookup_table, input_row_offsets, page_stride, layer)
        var weights = checked_layer[weight_dtype, qkv_format, out_format, fc_format, down_format]("gpt2_paged_decode_layer", D, ln_1_weight, ln_1_bias, ln_2_weight, ln_2_bias, epsilon, qkv_w, qkv_scales, qkv_bias, out_w, out_scales, out_bias, fc_w, fc_scales, fc_bias, down_w, down_scales, down_bias)
        var x_in = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr()))
        var y_out = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr()))
        if d == ROW:
            decode_layer[F32, ROW](x_in, y_out, kv, weights, R, S, H, d)
        else:
            decode_layer[F32, 0](x_in, y_out, kv, weights, R, S, H, d)
