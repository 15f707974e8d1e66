# gpt2_paged_attention: causal attention over MAX's paged KV cache, for a ragged batch, CPU, float32.
#
#     qkv                [T, 3D]     the step's new tokens, every request's end to end (D = H * d)
#     kv_blocks          [pages, 2, L, page_size, H, d]   MAX's cache: keys (0) and values (1) of every layer
#     cache_lengths      [R]         tokens request r had cached before this step
#     lookup_table       [R, P]      request r's token p lives on page lookup_table[r, p // page_size]
#     input_row_offsets  [R + 1]     request r owns tokens offsets[r]..offsets[r + 1] - 1 of qkv
#     page_stride        [1]         elements from one page to the next; -1: pages packed end to end
#     layer              [1]         which layer's keys and values these are
#     -> y               [T, D]      heads merged, ready for c_proj
#
# For each (request, head): write the request's new keys and values at positions
# cache_lengths[r].., then each new query scores every key up to its own position,
# softmax, and sums the values. Cache and qkv are read where they lie: a decoding
# step reads each cached key and value once, with no copies or masks.
import extensibility
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.memory import UnsafePointer, alloc

from .attend import F32, ROW, HeadCache, attend_head, attention_chunks

comptime U32 = DType.uint32


def paged_attention[
    W: Int
](
    blocks: UnsafePointer[Float32, MutAnyOrigin],
    qkv: UnsafePointer[Float32, ImmutAnyOrigin],
    cache_lengths: UnsafePointer[UInt32, ImmutAnyOrigin],
    lookup_table: UnsafePointer[UInt32, ImmutAnyOrigin],
    offsets: UnsafePointer[UInt32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    R: Int,
    P: Int,
    L: Int,
    page_size: Int,
    H: Int,
    d: Int,
    page_stride: Int,
    layer: Int,
):
    """The op on the buffers' raw pointers (shapes above); W = d when d is `ROW`, else 0."""
    var D = H * d
    var slot_stride = H * d  # from one token's (layer, head) to the next's on a page
    var value_offset = L * page_size * slot_stride  # from a page's keys to its values
    var work = 0
    var longest = 0
    for r in range(R):
        var new = Int(offsets[r + 1]) - Int(offsets[r])
        var seen = Int(cache_lengths[r]) + new
        work += H * new * seen * d
        longest = max(longest, seen)
    var pairs = R * H
    var chunks = attention_chunks(work, pairs)

    def attend(chunk: Int) {imm blocks, imm qkv, imm cache_lengths, imm lookup_table, imm offsets, imm y, imm P, imm page_size, imm H, imm d, imm page_stride, imm layer, imm D, imm slot_stride, imm value_offset, imm longest, imm pairs, imm chunks}:
        var scratch = alloc[Float32](longest + d)
        for task in range(chunk * pairs // chunks, (chunk + 1) * pairs // chunks):  # (request, head) pairs
            var r = task // H
            var h = task % H
            var first = Int(offsets[r])
            var head = blocks + layer * page_size * slot_stride + h * d  # (keys, layer, slot 0, head h) of page 0
            var cache = HeadCache[F32](head, lookup_table + r * P, page_size, page_stride, slot_stride, value_offset)
            var new = Int(offsets[r + 1]) - first
            var rows = qkv + first * 3 * D + h * d
            # No key bias here (a server's requests have no padding): qkv stands in, never read.
            attend_head[W, F32](cache, rows, y + first * D + h * d, qkv, False, new, Int(cache_lengths[r]), D, d, scratch)
        scratch.free()

    # Waking the other threads costs more than a short cache gains from them.
    if chunks == 1:
        attend(0)
    else:
        sync_parallelize(attend, chunks)


@extensibility.register("gpt2_paged_attention")
struct PagedAttention:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        kv_blocks: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=F32, rank=6, ...],
        qkv: InputTensor[dtype=F32, rank=2, ...],
        cache_lengths: InputTensor[dtype=U32, rank=1, ...],
        lookup_table: InputTensor[dtype=U32, rank=2, ...],
        input_row_offsets: InputTensor[dtype=U32, rank=1, ...],
        page_stride: InputTensor[dtype=DType.int64, rank=1, ...],
        layer: InputTensor[dtype=U32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_paged_attention runs on the CPU"
        var L = kv_blocks.dim_size(2)
        var page_size = kv_blocks.dim_size(3)
        var H = kv_blocks.dim_size(4)
        var d = kv_blocks.dim_size(5)
        var R = cache_lengths.dim_size(0)
        if kv_blocks.dim_size(1) != 2 or qkv.dim_size(1) != 3 * H * d or y.dim_size(1) != H * d:
            raise Error("gpt2_paged_attention: qkv, y and the cache's heads disagree on width")
        if input_row_offsets.dim_size(0) != R + 1 or lookup_table.dim_size(0) != R:
            raise Error("gpt2_paged_attention: cache_lengths, lookup_table and row offsets disagree on requests")
        var layer_index = Int(layer[0])
        if layer_index >= L:
            raise Error("gpt2_paged_attention: layer ", layer_index, " of a cache of ", L)
        var stride = Int(page_stride[0])
        if stride < 0:  # packed pages
            stride = 2 * L * page_size * H * d
        var P = lookup_table.dim_size(1)
        var total_pages = kv_blocks.dim_size(0)
        for r in range(R):  # the pages written and read must lie inside the blocks
            var seen = Int(cache_lengths[r]) + Int(input_row_offsets[r + 1]) - Int(input_row_offsets[r])
            var needed = (seen + page_size - 1) // page_size
            if needed > P:
                raise Error("gpt2_paged_attention: request ", r, " needs ", needed, " pages, its lookup table has ", P)
            for i in range(needed):
                if Int(lookup_table[r, i]) >= total_pages:
                    raise Error("gpt2_paged_attention: request ", r, " names page ", Int(lookup_table[r, i]), " of ", total_pages)
        var blocks = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(kv_blocks.unsafe_ptr()))
        var new = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(qkv.unsafe_ptr()))
        var cached = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(cache_lengths.unsafe_ptr()))
        var pages = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(lookup_table.unsafe_ptr()))
        var rows = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(input_row_offsets.unsafe_ptr()))
        var out = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr()))
        if d == ROW:
            paged_attention[ROW](blocks, new, cached, pages, rows, out, R, P, L, page_size, H, d, stride, layer_index)
        else:
            paged_attention[0](blocks, new, cached, pages, rows, out, R, P, L, page_size, H, d, stride, layer_index)
