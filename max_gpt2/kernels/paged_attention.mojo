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

from .attend import F32, ROW, attend_head, attention_chunks
from .layer_kv import LayerKV, paged_layer_kv
from .phases import chunk_span

comptime U32 = DType.uint32


def paged_attention[
    W: Int
](
    kv: LayerKV[F32],
    qkv: UnsafePointer[Float32, ImmutAnyOrigin],
    offsets: UnsafePointer[UInt32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    R: Int,
    H: Int,
    d: Int,
):
    """The op on the buffers' raw pointers (shapes above), the cache where `kv` says; W = d when d is
    `ROW`, else 0."""
    var D = H * d
    var work = 0
    for r in range(R):
        var new = Int(offsets[r + 1]) - Int(offsets[r])
        work += H * new * (kv.past(r) + new) * d
    var pairs = R * H
    var chunks = attention_chunks(work, pairs)

    def attend(chunk: Int) {imm kv, imm qkv, imm offsets, imm y, imm H, imm d, imm D, imm pairs, imm chunks}:
        var scratch = alloc[Float32](kv.longest + d)
        var first_task, last = chunk_span(chunk, chunks, pairs)
        for task in range(first_task, last):  # (request, head) pairs
            var r = task // H
            var h = task % H
            var first = Int(offsets[r])
            var new = Int(offsets[r + 1]) - first
            var rows = qkv + first * 3 * D + h * d
            var following = min(task + 1, last - 1) // H
            var next_seen = kv.past(following) + Int(offsets[following + 1]) - Int(offsets[following]) if task + 1 < last else 0
            # No key bias here (a server's requests have no padding): qkv stands in, never read.
            attend_head[W, F32](kv.head(r, h), rows, y + first * D + h * d, qkv, False, new, kv.past(r), D, d, scratch, kv.head(following, min(task + 1, last - 1) % H), next_seen)
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
        var H, d = kv_blocks.dim_size(4), kv_blocks.dim_size(5)
        if qkv.dim_size(1) != 3 * H * d or y.dim_size(1) != H * d:
            raise Error("gpt2_paged_attention: qkv, y and the cache's heads disagree on width")
        var kv = paged_layer_kv("gpt2_paged_attention", kv_blocks, cache_lengths, lookup_table, input_row_offsets, page_stride, layer)
        var new = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(qkv.unsafe_ptr()))
        var rows = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(input_row_offsets.unsafe_ptr()))
        var out = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(y.unsafe_ptr()))
        var R = cache_lengths.dim_size(0)
        if d == ROW:
            paged_attention[ROW](kv, new, rows, out, R, H, d)
        else:
            paged_attention[0](kv, new, rows, out, R, H, d)
