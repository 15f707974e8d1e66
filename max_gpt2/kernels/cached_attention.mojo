# gpt2_cached_attention: causal attention over GPT-2's KV cache, on the CPU, float32.
#
#     qkv       [B, S, 3D]       this call's S new tokens: queries, keys, values (D = H * d)
#     cache     [2, B, H, M, d]  keys, then values; positions 0..T-S-1 already written
#     key_bias  [B, T]           0 for a token, a large negative number for padding
#     -> y      [B, S, D]        heads merged, ready for c_proj
#
# For each (row, head): write the S new keys and values at positions T-S..T-1,
# then for each new query s (absolute position T-S+s) score every key up to its
# own position, softmax, and sum the values. Both the cache and qkv are read in
# place: nothing is copied, transposed or masked first.
import extensibility
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.math import exp, sqrt
from std.memory import UnsafePointer, alloc

comptime F32 = DType.float32
comptime LANES = 16  # float32 lanes of an AVX-512 register
comptime SERIAL_BELOW = 1 << 20  # key-dimension products (B * H * S * T * d) under which one thread does it all


@always_inline
def dot(a: UnsafePointer[Float32, ImmutAnyOrigin], b: UnsafePointer[Float32, MutAnyOrigin], n: Int) -> Float32:
    """A . b over n floats (also gpt2_paged_attention's, for head sizes other than 64)."""
    var acc = SIMD[F32, LANES](0)
    var i = 0
    while i + LANES <= n:
        acc = (a + i).load[width=LANES]().fma((b + i).load[width=LANES](), acc)
        i += LANES
    var total = acc.reduce_add()
    while i < n:
        total += a[i] * b[i]
        i += 1
    return total


@always_inline
def add_scaled(
    weight: Float32, x: UnsafePointer[Float32, MutAnyOrigin], y: UnsafePointer[Float32, MutAnyOrigin], n: Int
):
    """Y += weight * x."""
    var i = 0
    while i + LANES <= n:
        (y + i).store((x + i).load[width=LANES]().fma(SIMD[F32, LANES](weight), (y + i).load[width=LANES]()))
        i += LANES
    while i < n:
        y[i] += weight * x[i]
        i += 1


def cached_attention(
    cache: UnsafePointer[Float32, MutAnyOrigin],
    qkv: UnsafePointer[Float32, ImmutAnyOrigin],
    key_bias: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    B: Int,
    S: Int,
    H: Int,
    M: Int,
    d: Int,
    T: Int,
):
    """The op on dense row-major buffers (shapes above)."""
    var D = H * d
    var past = T - S
    var scale = 1 / sqrt(Float32(d))

    def attend(task: Int) {imm cache, imm qkv, imm key_bias, imm y, imm B, imm S, imm H, imm M, imm d, imm T, imm D, imm past, imm scale}:
        var b = task // H
        var h = task % H
        var keys = cache + (b * H + h) * M * d  # [M, d]
        var values = cache + ((B + b) * H + h) * M * d  # [M, d]
        for s in range(S):
            var new = qkv + (b * S + s) * 3 * D + h * d
            for i in range(d):
                keys[(past + s) * d + i] = new[D + i]
                values[(past + s) * d + i] = new[2 * D + i]
        var scratch = alloc[Float32](T + d)
        var scores = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(scratch))  # [T]
        var out = scores + T  # [d]
        for s in range(S):
            var query = qkv + (b * S + s) * 3 * D + h * d
            var seen = past + s + 1
            var top = Float32.MIN
            for t in range(seen):
                scores[t] = dot(query, keys + t * d, d) * scale + key_bias[b * T + t]
                top = max(top, scores[t])
            var total = Float32(0)
            for i in range(d):
                out[i] = 0
            for t in range(seen):
                var weight = exp(scores[t] - top)
                total += weight
                add_scaled(weight, values + t * d, out, d)
            for i in range(d):
                y[(b * S + s) * D + h * d + i] = out[i] / total
        scratch.free()

    # Waking the other threads costs more than a short cache gains from them.
    if B * H * S * T * d < SERIAL_BELOW:
        for task in range(B * H):
            attend(task)
    else:
        sync_parallelize(attend, B * H)


@extensibility.register("gpt2_cached_attention")
struct CachedAttention:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        y: OutputTensor[dtype=F32, rank=3, ...],
        cache: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=F32, rank=5, ...],
        qkv: InputTensor[dtype=F32, rank=3, ...],
        key_bias: InputTensor[dtype=F32, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_cached_attention runs on the CPU"
        var B = qkv.dim_size(0)
        var S = qkv.dim_size(1)
        var H = cache.dim_size(2)
        var M = cache.dim_size(3)
        var d = cache.dim_size(4)
        var T = key_bias.dim_size(1)
        if cache.dim_size(1) != B or key_bias.dim_size(0) != B or qkv.dim_size(2) != 3 * H * d:
            raise Error("gpt2_cached_attention: qkv, cache and key_bias disagree on batch or width")
        if S > T or T > M:
            raise Error("gpt2_cached_attention: needs new tokens <= total <= cache length")
        cached_attention(
            UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(cache.unsafe_ptr())),
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(qkv.unsafe_ptr())),
            UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(key_bias.unsafe_ptr())),
            UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr())),
            B,
            S,
            H,
            M,
            d,
            T,
        )
