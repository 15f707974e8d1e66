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
# go through the layer's phases together: every phase is cut into chunks that any thread claims
# with an atomic counter, and a thread moves on once every chunk of the phase is done. A thread
# that starts late finds the chunks taken and the work done, and one alone does it all, so no
# thread ever waits for another to arrive. Layer norms, the quantizing of x, GELU and the residual
# adds happen on the way into and out of the products (epilogue.mojo) instead of as ops of their own.
import extensibility
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.atomic import Atomic
from std.collections import Array
from std.math import sqrt
from std.memory import UnsafePointer, alloc
from std.sys.info import num_physical_cores
from std.sys.intrinsics import llvm_intrinsic

from .attend import ROW, HeadCache, attend_head
from .epilogue import ADD, GELU, STORE
from .packed_layout import F32, GROUP, Q4_0, Q8_0, check_bias, check_blocks, check_chunks, check_dense, row_chunks
from .quantized_matmul import QuantizedRows, block_groups
from .skinny_matmul import dense_rows

# Chunks a product's outputs are cut into; claimed one at a time, so a thread that is busy
# elsewhere leaves its share to the others. Whole steps of GPT-2 small on a 2-core Zen 3 against 8:
# 4 and 16 chunks 1.00-1.04x the time in float32, q8_0 and q4_0, 2 chunks 1.01-1.04x in q8_0 and
# q4_0; bfloat16 alone runs best at one a core (2: 0.96x at batch 1, 0.95x at batch 8).
comptime PRODUCT_CHUNKS = 8
comptime PHASES = 9
comptime LINE = 8  # Int64 counters a cache line: each counter on a line of its own


def format_of[WT: DType]() -> Int:
    """The block format a weight dtype stands for (Q8_0: int8, Q4_0: uint8), 0 for float32 and bfloat16."""
    comptime if WT == DType.int8:
        return Q8_0
    elif WT == DType.uint8:
        return Q4_0
    else:
        return 0


struct Phases(ImplicitlyCopyable):
    """Per phase, two counters shared by the threads: the chunks claimed and the chunks done."""

    var counters: UnsafePointer[Int64, MutUntrackedOrigin]

    def __init__(out self):
        self.counters = alloc[Int64](2 * PHASES * LINE)
        for i in range(2 * PHASES * LINE):
            (self.counters + i).store(0)

    def share[body: def(Int) capturing -> None](self, phase: Int, chunks: Int):
        """Runs `body(c)` for each chunk c < `chunks` no other thread has claimed, then waits until every
        chunk of the phase is done (by whichever thread): what it wrote is then there for all."""
        var claimed = self.counters + 2 * phase * LINE
        var done = claimed + LINE
        while True:
            var chunk = Int(Atomic[Int64].fetch_add(claimed, 1))
            if chunk >= chunks:
                break
            body(chunk)
            _ = Atomic[Int64].fetch_add(done, 1)
        while Int(Atomic[Int64].load(done)) < chunks:
            llvm_intrinsic["llvm.x86.sse2.pause", NoneType]()

    def free(self):
        self.counters.free()


struct Product[WT: DType](ImplicitlyCopyable):
    """One of the layer's products, y [rows, N] = x [rows, K] @ W^T + bias, W stored as WT says."""

    var w: Int  # addresses: the weight, its block scales (q8_0, q4_0) and the bias
    var scales: Int
    var bias: Int
    var has_bias: Bool
    var K: Int
    var N: Int

    def __init__(out self, w: Int, scales: Int, bias: Int, has_bias: Bool, K: Int, N: Int):
        self.w, self.scales, self.bias, self.has_bias, self.K, self.N = w, scales, bias, has_bias, K, N

    def units(self) -> Int:
        """What a chunk is made of: groups of 8 outputs (packed blocks) or 24 outputs (float rows)."""
        comptime if format_of[Self.WT]() != 0:
            return (self.N + GROUP - 1) // GROUP
        return (self.N + 23) // 24

    def chunks(self) -> Int:
        comptime if Self.WT == DType.bfloat16:
            return min(self.units(), row_chunks())
        return min(self.units(), PRODUCT_CHUNKS)

    def run[
        EPILOGUE: Int
    ](
        self,
        x: UnsafePointer[Float32, ImmutAnyOrigin],
        xq: QuantizedRows[format_of[Self.WT]()],
        y: UnsafePointer[Float32, MutAnyOrigin],
        rows: Int,
        chunk: Int,
    ):
        """Chunk `chunk` of `chunks()` of the outputs, from x (float formats) or xq (block formats)."""
        var units = self.units()
        var first = chunk * units // self.chunks()
        var last = (chunk + 1) * units // self.chunks()
        var bias = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=self.bias)
        comptime FORMAT = format_of[Self.WT]()
        comptime if FORMAT != 0:
            var w = UnsafePointer[UInt8, ImmutAnyOrigin](unsafe_from_address=self.w)
            var d = UnsafePointer[Float16, ImmutAnyOrigin](unsafe_from_address=self.scales)
            block_groups[FORMAT, EPILOGUE](w, d, xq, bias, self.has_bias, y, rows, self.N, first, last)
        else:
            var w = UnsafePointer[Scalar[Self.WT], ImmutAnyOrigin](unsafe_from_address=self.w)
            dense_rows[Self.WT, EPILOGUE](x, w, bias, self.has_bias, y, rows, self.K, self.N, first * 24, min(last * 24, self.N))


@always_inline
def _reads(buffer: UnsafePointer[Float32, _]) -> UnsafePointer[Float32, ImmutAnyOrigin]:
    return UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(buffer))


@always_inline
def _writes(buffer: UnsafePointer[Float32, _]) -> UnsafePointer[Float32, MutAnyOrigin]:
    return UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(buffer))


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
    var phases = Phases()
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


def _product[
    WT: DType
](
    name: StaticString,
    w: InputTensor[dtype=WT, rank=2, ...],
    scales: InputTensor[dtype=DType.float16, rank=2, ...],
    bias: InputTensor[dtype=F32, rank=1, ...],
    K: Int,
    N: Int,
) raises -> Product[WT]:
    """A product's tensors checked against its K inputs and N outputs."""
    comptime FORMAT = format_of[WT]()
    comptime if FORMAT != 0:
        check_blocks(name, FORMAT, K, N, w.dim_size(0), w.dim_size(1), scales.dim_size(0), scales.dim_size(1))
        check_dense(name, scales.dim_size(0), scales.dim_size(1), scales.stride_length(0), scales.stride_length(1))
    elif WT == F32:
        if w.dim_size(0) != N or w.dim_size(1) != K:
            raise Error(name, ": the weight is [", w.dim_size(0), ", ", w.dim_size(1), "]; the layer needs [", N, ", ", K, "]")
    else:
        check_chunks(name, K, N, w.dim_size(0), w.dim_size(1))
    check_dense(name, w.dim_size(0), w.dim_size(1), w.stride_length(0), w.stride_length(1))
    check_bias(name, N, bias.dim_size(0), bias.stride_length(0))
    return Product[WT](Int(w.unsafe_ptr()), Int(scales.unsafe_ptr()), Int(bias.unsafe_ptr()), bias.dim_size(0) == N, K, N)


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
        var qkv_product = _product[weight_dtype]("gpt2_decode_layer c_attn", qkv_w, qkv_scales, qkv_bias, D, 3 * D)
        var out_product = _product[weight_dtype]("gpt2_decode_layer attn c_proj", out_w, out_scales, out_bias, D, D)
        var fc_product = _product[weight_dtype]("gpt2_decode_layer c_fc", fc_w, fc_scales, fc_bias, D, wide)
        var down_product = _product[weight_dtype]("gpt2_decode_layer mlp c_proj", down_w, down_scales, down_bias, wide, D)
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
