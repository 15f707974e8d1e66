# gpt2_decode_layer: one GPT-2 block for a few new tokens as a single op, on the CPU (float32
# activations; weights float32, bfloat16, q8_0 or q4_0; the KV cache float32 or float16):
#
#     x         [B, S, D]        the residual stream of this call's S new tokens
#     cache     [2, B, H, M, d]  the layer's keys and values, written in place (as gpt2_cached_attention)
#     key_bias  [B, T]           0 for a token, a large negative number for padding
#     ln_1, ln_2                 weight and bias [D] each; epsilon [1], the layer norms'
#     c_attn, attn c_proj,       each a weight and its scales (empty [0, 0] for float32 and bfloat16)
#     c_fc, mlp c_proj           as the packed products take them, and a bias (empty: none)
#     -> y      [B, S, D]        x + attn(ln_1(x)), then that + mlp(ln_2(that)), GELU (tanh) between
#
# Op by op, a layer of a decoding step is some ten ops, five of them split across the threads, and at
# packed sizes the product's weights stream in a few hundred microseconds while each op costs its
# launch and each split its wake of the other threads. Here the threads are woken once a layer and
# go through its phases together (phases.mojo). Layer norms, the quantizing of x, GELU and the
# residual adds happen on the way into and out of the products (epilogue.mojo) instead of as ops
# of their own.
import extensibility
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.collections import Array
from std.memory import UnsafePointer, alloc
from std.sys.info import num_physical_cores

from .attend import ROW, HeadCache, attend_head
from .epilogue import ADD, GELU, STORE
from .layer_norm import layer_norm
from .layer_products import Product, checked_product, format_of
from .packed_layout import F32
from .phases import Phases
from .quantized_rows import QuantizedRows


comptime PHASES = 9  # norm, qkv, attention, quantize, out, norm, fc, quantize, down


@always_inline
def _reads(buffer: UnsafePointer[Float32, _]) -> UnsafePointer[Float32, ImmutAnyOrigin]:
    return UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(buffer))


@always_inline
def _writes(buffer: UnsafePointer[Float32, _]) -> UnsafePointer[Float32, MutAnyOrigin]:
    return UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(buffer))


def decode_layer[
    WT: DType, CT: DType, W: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    cache: UnsafePointer[Scalar[CT], MutAnyOrigin],
    key_bias: UnsafePointer[Float32, ImmutAnyOrigin],
    norms: Array[UnsafePointer[Float32, ImmutAnyOrigin], 4],  # ln_1 weight and bias, ln_2 weight and bias
    epsilon: Float32,
    qkv_product: Product[WT],
    out_product: Product[WT],
    fc_product: Product[WT],
    down_product: Product[WT],
    B: Int,
    S: Int,
    H: Int,
    M: Int,
    d: Int,
    T: Int,
):
    """The op on dense row-major buffers (shapes above); W = d when d is `ROW`, else 0."""
    comptime FORMAT = format_of[WT]()
    var D = H * d
    var rows = B * S
    var wide = fc_product.N
    var quantized = rows if FORMAT != 0 else 0  # float formats read x as it is
    var normed = alloc[Float32](rows * D)
    var qkv = alloc[Float32](rows * 3 * D)
    var attended = alloc[Float32](rows * D)
    var hidden = alloc[Float32](rows * wide)
    var normed_q = QuantizedRows[FORMAT](quantized, D)
    var attended_q = QuantizedRows[FORMAT](quantized, D)
    var hidden_q = QuantizedRows[FORMAT](quantized, wide)
    var phases = Phases[PHASES]()
    var first_page = UInt32(0)  # each (row, head)'s M positions are one page
    var pages = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=first_page)))
    var pairs = B * H

    def work(task: Int) {imm x, imm y, imm cache, imm key_bias, imm norms, imm epsilon, imm qkv_product, imm out_product, imm fc_product, imm down_product, imm B, imm S, imm H, imm M, imm d, imm T, imm D, imm rows, imm normed, imm qkv, imm attended, imm hidden, imm normed_q, imm attended_q, imm hidden_q, imm phases, imm pages, imm pairs}:
        @parameter
        def first_norm(chunk: Int):
            for i in range(rows * D):
                y[i] = x[i]  # the residual stream, which the products add to
            layer_norm(_reads(y), norms[0], norms[1], epsilon, _writes(normed), rows, D)
            comptime if FORMAT != 0:
                normed_q.quantize(_reads(normed), rows)

        @parameter
        def project_qkv(chunk: Int):
            qkv_product.run[STORE](_reads(normed), normed_q, _writes(qkv), rows, chunk)

        @parameter
        def attend(pair: Int):
            var scratch = alloc[Float32](T + d)
            var b = pair // H
            var h = pair % H
            var head = HeadCache[CT](cache + (b * H + h) * M * d, pages, M, 0, d, B * H * M * d)
            attend_head[W, CT](head, _reads(qkv) + b * S * 3 * D + h * d, _writes(attended) + b * S * D + h * d, key_bias + b * T, True, S, T - S, D, d, scratch)
            scratch.free()

        @parameter
        def quantize_attended(chunk: Int):
            attended_q.quantize(_reads(attended), rows)

        @parameter
        def project_out(chunk: Int):
            out_product.run[ADD](_reads(attended), attended_q, y, rows, chunk)

        @parameter
        def second_norm(chunk: Int):
            layer_norm(_reads(y), norms[2], norms[3], epsilon, _writes(normed), rows, D)
            comptime if FORMAT != 0:
                normed_q.quantize(_reads(normed), rows)

        @parameter
        def expand(chunk: Int):
            fc_product.run[GELU](_reads(normed), normed_q, _writes(hidden), rows, chunk)

        @parameter
        def quantize_hidden(chunk: Int):
            hidden_q.quantize(_reads(hidden), rows)

        @parameter
        def project_down(chunk: Int):
            down_product.run[ADD](_reads(hidden), hidden_q, y, rows, chunk)

        phases.share[first_norm](0, 1)
        phases.share[project_qkv](1, qkv_product.chunks())
        phases.share[attend](2, pairs)
        comptime if FORMAT != 0:
            phases.share[quantize_attended](3, 1)
        phases.share[project_out](4, out_product.chunks())
        phases.share[second_norm](5, 1)
        phases.share[expand](6, fc_product.chunks())
        comptime if FORMAT != 0:
            phases.share[quantize_hidden](7, 1)
        phases.share[project_down](8, down_product.chunks())

    sync_parallelize(work, num_physical_cores())
    phases.free()
    normed_q.free()
    attended_q.free()
    hidden_q.free()
    normed.free()
    qkv.free()
    attended.free()
    hidden.free()


@extensibility.register("gpt2_decode_layer")
struct DecodeLayer:
    @staticmethod
    def execute[
        target: StaticString,
        weight_dtype: DType,
        cache_dtype: DType,
    ](
        y: OutputTensor[dtype=F32, rank=3, ...],
        cache: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=cache_dtype, rank=5, ...],
        x: InputTensor[dtype=F32, rank=3, ...],
        key_bias: InputTensor[dtype=F32, rank=2, ...],
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
        comptime assert target == "cpu", "gpt2_decode_layer runs on the CPU"
        comptime assert cache_dtype == F32 or cache_dtype == DType.float16, "gpt2_decode_layer keeps a float32 or float16 cache"
        var B, S, D = x.dim_size(0), x.dim_size(1), x.dim_size(2)
        var H, M, d = cache.dim_size(2), cache.dim_size(3), cache.dim_size(4)
        var T = key_bias.dim_size(1)
        var wide = fc_bias.dim_size(0)
        if cache.dim_size(1) != B or key_bias.dim_size(0) != B or H * d != D:
            raise Error("gpt2_decode_layer: x [", B, ", ", S, ", ", D, "], the cache [2, ", cache.dim_size(1), ", ", H, ", ", M, ", ", d, "] and key_bias [", key_bias.dim_size(0), ", ", T, "] disagree on batch or width")
        if S > T or T > M:
            raise Error("gpt2_decode_layer: needs new tokens (", S, ") <= total (", T, ") <= cache length (", M, ")")
        if ln_1_weight.dim_size(0) != D or ln_1_bias.dim_size(0) != D or ln_2_weight.dim_size(0) != D or ln_2_bias.dim_size(0) != D:
            raise Error("gpt2_decode_layer: the layer norms' weights and biases need ", D, " values each; got ", ln_1_weight.dim_size(0), ", ", ln_1_bias.dim_size(0), ", ", ln_2_weight.dim_size(0), ", ", ln_2_bias.dim_size(0))
        if y.dim_size(0) != B or y.dim_size(1) != S or y.dim_size(2) != D:
            raise Error("gpt2_decode_layer: y is [", y.dim_size(0), ", ", y.dim_size(1), ", ", y.dim_size(2), "], x [", B, ", ", S, ", ", D, "]")
        if wide == 0:
            raise Error("gpt2_decode_layer: c_fc needs its bias, whose length gives the MLP's width")
        var qkv_product = checked_product[weight_dtype]("gpt2_decode_layer c_attn", qkv_w, qkv_scales, qkv_bias, D, 3 * D)
        var out_product = checked_product[weight_dtype]("gpt2_decode_layer attn c_proj", out_w, out_scales, out_bias, D, D)
        var fc_product = checked_product[weight_dtype]("gpt2_decode_layer c_fc", fc_w, fc_scales, fc_bias, D, wide)
        var down_product = checked_product[weight_dtype]("gpt2_decode_layer mlp c_proj", down_w, down_scales, down_bias, wide, D)
        var cached = UnsafePointer[Scalar[cache_dtype], MutAnyOrigin](unsafe_from_address=Int(cache.unsafe_ptr()))
        var x_in = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr()))
        var y_out = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr()))
        var bias = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(key_bias.unsafe_ptr()))
        var norm = Array[UnsafePointer[Float32, ImmutAnyOrigin], 4](uninitialized=True)
        norm[0] = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(ln_1_weight.unsafe_ptr()))
        norm[1] = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(ln_1_bias.unsafe_ptr()))
        norm[2] = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(ln_2_weight.unsafe_ptr()))
        norm[3] = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(ln_2_bias.unsafe_ptr()))
        var eps = epsilon.unsafe_ptr()[0]
        if d == ROW:
            decode_layer[weight_dtype, cache_dtype, ROW](x_in, y_out, cached, bias, norm, eps, qkv_product, out_product, fc_product, down_product, B, S, H, M, d, T)
        else:
            decode_layer[weight_dtype, cache_dtype, 0](x_in, y_out, cached, bias, norm, eps, qkv_product, out_product, fc_product, down_product, B, S, H, M, d, T)
