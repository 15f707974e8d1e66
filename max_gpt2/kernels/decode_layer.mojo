# gpt2_decode_layer: one GPT-2 block for a few new tokens as a single op, on the CPU (float32
# activations; weights float32, bfloat16 or a block format, each product in its own, its
# parameter `qkv_format`, ... naming it (packed_layout.mojo's codes, 0 for float32 and bfloat16);
# the KV cache float32 or float16):
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
from std.memory import UnsafePointer, alloc
from std.sys.info import num_physical_cores

from .attend import ROW, attend_head
from .epilogue import ADD, GELU, STORE
from .layer_kv import LayerKV
from .layer_norm import layer_norm
from .layer_products import Product, checked_product
from .packed_layout import F32, activation_of
from .phases import Phases, chunk_span
from .quantized_rows import QuantizedRows


comptime PHASES = 9  # norm, qkv, attention, quantize, out, norm, fc, quantize, down


@always_inline
def _reads(buffer: UnsafePointer[Float32, _]) -> UnsafePointer[Float32, ImmutAnyOrigin]:
    return UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(buffer))


@always_inline
def _writes(buffer: UnsafePointer[Float32, _]) -> UnsafePointer[Float32, MutAnyOrigin]:
    return UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(buffer))


struct LayerWeights[WT: DType, QKV: Int, OUT: Int, FC: Int, DOWN: Int](ImplicitlyCopyable):
    """A block's parameters as the op reads them: the layer norms, their epsilon and the four products,
    each in its format (and x rounded as its format's products read it)."""

    var norms: SIMD[DType.int64, 4]  # addresses: ln_1's weight and bias, ln_2's weight and bias
    var epsilon: Float32
    var qkv: Product[Self.WT, Self.QKV]
    var proj: Product[Self.WT, Self.OUT]
    var fc: Product[Self.WT, Self.FC]
    var down: Product[Self.WT, Self.DOWN]

    def __init__(
        out self,
        norms: SIMD[DType.int64, 4],
        epsilon: Float32,
        qkv: Product[Self.WT, Self.QKV],
        proj: Product[Self.WT, Self.OUT],
        fc: Product[Self.WT, Self.FC],
        down: Product[Self.WT, Self.DOWN],
    ):
        self.norms, self.epsilon, self.qkv, self.proj, self.fc, self.down = norms, epsilon, qkv, proj, fc, down

    @always_inline
    def norm(self, i: Int) -> UnsafePointer[Float32, ImmutAnyOrigin]:
        """ln_1's weight (0) and bias (1), ln_2's weight (2) and bias (3)."""
        return UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(self.norms[i]))


def checked_layer[
    WT: DType, QKV: Int, OUT: Int, FC: Int, DOWN: Int
](
    op: String,
    D: Int,
    ln_1_weight: InputTensor[dtype=F32, rank=1, ...],
    ln_1_bias: InputTensor[dtype=F32, rank=1, ...],
    ln_2_weight: InputTensor[dtype=F32, rank=1, ...],
    ln_2_bias: InputTensor[dtype=F32, rank=1, ...],
    epsilon: InputTensor[dtype=F32, rank=1, ...],
    qkv_w: InputTensor[dtype=WT, rank=2, ...],
    qkv_scales: InputTensor[dtype=DType.float16, rank=2, ...],
    qkv_bias: InputTensor[dtype=F32, rank=1, ...],
    out_w: InputTensor[dtype=WT, rank=2, ...],
    out_scales: InputTensor[dtype=DType.float16, rank=2, ...],
    out_bias: InputTensor[dtype=F32, rank=1, ...],
    fc_w: InputTensor[dtype=WT, rank=2, ...],
    fc_scales: InputTensor[dtype=DType.float16, rank=2, ...],
    fc_bias: InputTensor[dtype=F32, rank=1, ...],
    down_w: InputTensor[dtype=WT, rank=2, ...],
    down_scales: InputTensor[dtype=DType.float16, rank=2, ...],
    down_bias: InputTensor[dtype=F32, rank=1, ...],
) raises -> LayerWeights[WT, QKV, OUT, FC, DOWN]:
    """A block's tensors checked against its width D (`op` names the op in the errors)."""
    var wide = fc_bias.dim_size(0)
    if ln_1_weight.dim_size(0) != D or ln_1_bias.dim_size(0) != D or ln_2_weight.dim_size(0) != D or ln_2_bias.dim_size(0) != D:
        raise Error(op, ": the layer norms' weights and biases need ", D, " values each; got ", ln_1_weight.dim_size(0), ", ", ln_1_bias.dim_size(0), ", ", ln_2_weight.dim_size(0), ", ", ln_2_bias.dim_size(0))
    if wide == 0:
        raise Error(op, ": c_fc needs its bias, whose length gives the MLP's width")
    var norms = SIMD[DType.int64, 4](Int64(Int(ln_1_weight.unsafe_ptr())), Int64(Int(ln_1_bias.unsafe_ptr())), Int64(Int(ln_2_weight.unsafe_ptr())), Int64(Int(ln_2_bias.unsafe_ptr())))
    return LayerWeights[WT, QKV, OUT, FC, DOWN](
        norms,
        epsilon.unsafe_ptr()[0],
        checked_product[WT, QKV](op + " c_attn", qkv_w, qkv_scales, qkv_bias, D, 3 * D),
        checked_product[WT, OUT](op + " attn c_proj", out_w, out_scales, out_bias, D, D),
        checked_product[WT, FC](op + " c_fc", fc_w, fc_scales, fc_bias, D, wide),
        checked_product[WT, DOWN](op + " mlp c_proj", down_w, down_scales, down_bias, wide, D),
    )


def decode_layer[
    WT: DType, QKV: Int, OUT: Int, FC: Int, DOWN: Int, //, CT: DType, W: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    kv: LayerKV[CT],
    weights: LayerWeights[WT, QKV, OUT, FC, DOWN],
    B: Int,
    S: Int,
    H: Int,
    d: Int,
):
    """The op on row-major x and y [B, S, D], the cache where `kv` says; W = d when d is `ROW`, else 0."""
    comptime NORMED = activation_of[QKV]()  # how each product's x is rounded (0: float formats read
    comptime ATTENDED = activation_of[OUT]()  # it as it is)
    comptime EXPANDED = activation_of[FC]()
    comptime HIDDEN = activation_of[DOWN]()
    var D = H * d
    var rows = B * S
    var wide = weights.fc.N
    var normed = alloc[Float32](rows * D)
    var qkv = alloc[Float32](rows * 3 * D)
    var attended = alloc[Float32](rows * D)
    var hidden = alloc[Float32](rows * wide)
    var normed_q = QuantizedRows[NORMED](rows if NORMED != 0 else 0, D)
    var attended_q = QuantizedRows[ATTENDED](rows if ATTENDED != 0 else 0, D)
    var expanded_q = QuantizedRows[EXPANDED](rows if EXPANDED != 0 else 0, D)  # ln_2(x) as c_fc reads it
    var hidden_q = QuantizedRows[HIDDEN](rows if HIDDEN != 0 else 0, wide)
    var phases = Phases[PHASES]()
    var pairs = B * H
    # One run of pairs a core, each pair requesting the next one's keys and values as it goes: the
    # requests shorten a batch's packed steps and leave one row's unchanged (docs/performance.md).
    var attend_chunks = min(pairs, num_physical_cores())
    # The layer norms and x's rounding split by rows too: against a prompt's hundreds of rows, one
    # thread doing them alone left the other waiting (docs/performance.md).
    var row_chunks = min(rows, num_physical_cores())

    def work(task: Int) {imm x, imm y, imm kv, imm weights, imm S, imm H, imm d, imm D, imm rows, imm normed, imm qkv, imm attended, imm hidden, imm normed_q, imm attended_q, imm expanded_q, imm hidden_q, imm phases, imm pairs, imm attend_chunks, imm row_chunks}:
        @parameter
        def first_norm(chunk: Int):
            var first, last = chunk_span(chunk, row_chunks, rows)
            for i in range(first * D, last * D):
                y[i] = x[i]  # the residual stream, which the products add to
            layer_norm(_reads(y) + first * D, weights.norm(0), weights.norm(1), weights.epsilon, _writes(normed) + first * D, last - first, D)
            comptime if NORMED != 0:
                normed_q.quantize(_reads(normed), first, last)

        @parameter
        def project_qkv(chunk: Int):
            weights.qkv.run[STORE](_reads(normed), normed_q, _writes(qkv), rows, chunk)

        # A thread takes a run of neighbouring (row, head) pairs, as gpt2_paged_attention splits them:
        # in MAX's pages a token's heads lie side by side. Handed out one pair at a time, the two
        # threads read alternate heads of the same tokens, which made a served step of many requests
        # longer (docs/performance.md); one request's steps are unchanged.
        @parameter
        def attend(chunk: Int):
            var scratch = alloc[Float32](kv.longest + d)
            var first, last = chunk_span(chunk, attend_chunks, pairs)
            for pair in range(first, last):
                var b = pair // H
                var h = pair % H
                var following = min(pair + 1, last - 1)
                var next_seen = kv.past(following // H) + S if pair + 1 < last else 0
                attend_head[W, CT](kv.head(b, h), _reads(qkv) + b * S * 3 * D + h * d, _writes(attended) + b * S * D + h * d, kv.bias(b), kv.has_key_bias, S, kv.past(b), D, d, scratch, kv.head(following // H, following % H), next_seen)
            scratch.free()

        @parameter
        def quantize_attended(chunk: Int):
            var first, last = chunk_span(chunk, row_chunks, rows)
            attended_q.quantize(_reads(attended), first, last)

        @parameter
        def project_out(chunk: Int):
            weights.proj.run[ADD](_reads(attended), attended_q, y, rows, chunk)

        @parameter
        def second_norm(chunk: Int):
            var first, last = chunk_span(chunk, row_chunks, rows)
            layer_norm(_reads(y) + first * D, weights.norm(2), weights.norm(3), weights.epsilon, _writes(normed) + first * D, last - first, D)
            comptime if EXPANDED != 0:
                expanded_q.quantize(_reads(normed), first, last)

        @parameter
        def expand(chunk: Int):
            weights.fc.run[GELU](_reads(normed), expanded_q, _writes(hidden), rows, chunk)

        @parameter
        def quantize_hidden(chunk: Int):
            var first, last = chunk_span(chunk, row_chunks, rows)
            hidden_q.quantize(_reads(hidden), first, last)

        @parameter
        def project_down(chunk: Int):
            weights.down.run[ADD](_reads(hidden), hidden_q, y, rows, chunk)

        phases.share[first_norm](0, row_chunks)
        phases.share[project_qkv](1, weights.qkv.chunks())
        phases.share[attend](2, attend_chunks)
        comptime if ATTENDED != 0:
            phases.share[quantize_attended](3, row_chunks)
        phases.share[project_out](4, weights.proj.chunks())
        phases.share[second_norm](5, row_chunks)
        phases.share[expand](6, weights.fc.chunks())
        comptime if HIDDEN != 0:
            phases.share[quantize_hidden](7, row_chunks)
        phases.share[project_down](8, weights.down.chunks())

    sync_parallelize(work, num_physical_cores())
    phases.free()
    normed_q.free()
    attended_q.free()
    expanded_q.free()
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
        qkv_format: Int,
        out_format: Int,
        fc_format: Int,
        down_format: Int,
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
        if cache.dim_size(1) != B or key_bias.dim_size(0) != B or H * d != D:
            raise Error("gpt2_decode_layer: x [", B, ", ", S, ", ", D, "], the cache [2, ", cache.dim_size(1), ", ", H, ", ", M, ", ", d, "] and key_bias [", key_bias.dim_size(0), ", ", T, "] disagree on batch or width")
        if S > T or T > M:
            raise Error("gpt2_decode_layer: needs new tokens (", S, ") <= total (", T, ") <= cache length (", M, ")")
        if y.dim_size(0) != B or y.dim_size(1) != S or y.dim_size(2) != D:
            raise Error("gpt2_decode_layer: y is [", y.dim_size(0), ", ", y.dim_size(1), ", ", y.dim_size(2), "], x [", B, ", ", S, ", ", D, "]")
        var weights = checked_layer[weight_dtype, qkv_format, out_format, fc_format, down_format]("gpt2_decode_layer", D, ln_1_weight, ln_1_bias, ln_2_weight, ln_2_bias, epsilon, qkv_w, qkv_scales, qkv_bias, out_w, out_scales, out_bias, fc_w, fc_scales, fc_bias, down_w, down_scales, down_bias)
        var first_page = UInt32(0)  # each (row, head)'s M positions are one page
        var one_page = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=first_page)))
        var cached = UnsafePointer[Scalar[cache_dtype], MutAnyOrigin](unsafe_from_address=Int(cache.unsafe_ptr()))
        var bias = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(key_bias.unsafe_ptr()))
        var kv = LayerKV[cache_dtype](cached, one_page, bias, B, S, H, M, d, T)
        var x_in = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(x.unsafe_ptr()))
        var y_out = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr()))
        if d == ROW:
            decode_layer[cache_dtype, ROW](x_in, y_out, kv, weights, B, S, H, d)
        else:
            decode_layer[cache_dtype, 0](x_in, y_out, kv, weights, B, S, H, d)
