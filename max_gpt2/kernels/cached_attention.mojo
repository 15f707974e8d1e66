# gpt2_cached_attention: causal attention over GPT-2's KV cache, on the CPU, float32 (the cache
# float32 or float16: stored rounded, read widened; scores and sums in float32).
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
from std.memory import UnsafePointer, alloc

from .attend import F32, ROW, HeadCache, attend_head, attention_chunks
from .phases import chunk_span


def cached_attention[
    W: Int, CT: DType
](
    cache: UnsafePointer[Scalar[CT], MutAnyOrigin],
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
    """The op on dense row-major buffers (shapes above); W = d when d is `ROW`, else 0."""
    var D = H * d
    var pairs = B * H
    var chunks = attention_chunks(pairs * S * T * d, pairs)
    var first_page = UInt32(0)  # each (row, head)'s M positions are one page
    var pages = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=first_page)))

    def attend(chunk: Int) {imm cache, imm qkv, imm key_bias, imm y, imm B, imm S, imm H, imm M, imm d, imm T, imm D, imm pairs, imm chunks, imm pages}:
        var scratch = alloc[Float32](T + d)
        var first_task, last = chunk_span(chunk, chunks, pairs)
        for task in range(first_task, last):  # (row, head) pairs, each b * H + h
            var head = HeadCache[CT](cache + task * M * d, pages, M, 0, d, B * H * M * d)
            var following = HeadCache[CT](cache + min(task + 1, last - 1) * M * d, pages, M, 0, d, B * H * M * d)
            var b = task // H
            var first = qkv + b * S * 3 * D + (task % H) * d
            var next_seen = T if task + 1 < last else 0
            attend_head[W, CT](head, first, y + b * S * D + (task % H) * d, key_bias + b * T, True, S, T - S, D, d, scratch, following, next_seen)
        scratch.free()

    if chunks == 1:
        attend(0)
    else:
        sync_parallelize(attend, chunks)


@extensibility.register("gpt2_cached_attention")
struct CachedAttention:
    @staticmethod
    def execute[
        target: StaticString,
        cache_dtype: DType,
    ](
        y: OutputTensor[dtype=F32, rank=3, ...],
        cache: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=cache_dtype, rank=5, ...],
        qkv: InputTensor[dtype=F32, rank=3, ...],
        key_bias: InputTensor[dtype=F32, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_cached_attention runs on the CPU"
        comptime assert cache_dtype == F32 or cache_dtype == DType.float16, "gpt2_cached_attention keeps a float32 or float16 cache"
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
        var cached = UnsafePointer[Scalar[cache_dtype], MutAnyOrigin](unsafe_from_address=Int(cache.unsafe_ptr()))
        var new = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(qkv.unsafe_ptr()))
        var bias = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(key_bias.unsafe_ptr()))
        var out = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr()))
        if d == ROW:
            cached_attention[ROW, cache_dtype](cached, new, bias, out, B, S, H, M, d, T)
        else:
            cached_attention[0, cache_dtype](cached, new, bias, out, B, S, H, M, d, T)
