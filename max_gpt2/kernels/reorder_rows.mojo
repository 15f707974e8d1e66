# gpt2_reorder_rows: beam search's cache reorder, in place, on the CPU.
#
#     cache    [2, B, H, M, d]  keys, then values; positions 0..T-1 written
#     rows     [B] int64        row b takes what row rows[b] holds
#     kept     [B] int64        row b's first kept[b] positions already equal its source's
#     written  [B, T] int64     its shape gives T (the attention mask of the positions written)
#
# For each (keys or values, head), positions kept[b]..T-1 of each row b that changes are copied
# from its source row; a source that is itself overwritten is saved to a scratch block first. Rows
# whose index stays are not touched, nor positions T..M-1. Beam search's rows share their prompt
# and most of their tokens, so `kept` leaves only the last few positions to move.
import extensibility
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.memory import UnsafePointer, alloc

# Elements moved from which the (keys or values, head) pairs are split between threads: below it,
# waking them costs more than the copy (docs/performance.md).
comptime PARALLEL_FROM = 1 << 20


def reorder_rows[
    CT: DType
](
    cache: UnsafePointer[Scalar[CT], MutAnyOrigin],
    rows: UnsafePointer[Int64, ImmutAnyOrigin],
    kept: UnsafePointer[Int64, ImmutAnyOrigin],
    B: Int,
    H: Int,
    M: Int,
    d: Int,
    T: Int,
):
    """The op on a dense row-major cache (shapes above)."""
    var block = T * d  # one (row, head)'s written keys or values, contiguous

    def move(task: Int) {imm cache, imm rows, imm kept, imm B, imm H, imm M, imm d, imm T, imm block}:
        var kv = task // H
        var head = task % H
        var first = cache + (kv * B * H + head) * M * d  # row 0's block; row b's is b * H * M * d on
        var row_stride = H * M * d
        var held = alloc[Scalar[CT]](B * block)
        var scratch = UnsafePointer[Scalar[CT], MutAnyOrigin](unsafe_from_address=Int(held))
        for s in range(B):  # sources that are themselves overwritten are saved before any write
            if Int(rows[s]) != s:
                var low = _first_taken(rows, kept, B, s, T) * d
                if low < block:
                    _copy(scratch + s * block + low, first + s * row_stride + low, block - low)
        for b in range(B):
            var s = Int(rows[b])
            var low = Int(kept[b]) * d
            if s != b and low < block:
                var saved = Int(rows[s]) != s
                var src = scratch + s * block if saved else first + s * row_stride
                _copy(first + b * row_stride + low, src + low, block - low)
        held.free()

    var moved = 0
    for b in range(B):
        if Int(rows[b]) != b:
            moved += (T - Int(kept[b])) * d
    if moved * 2 * H < PARALLEL_FROM:
        for task in range(2 * H):
            move(task)
    else:
        sync_parallelize(move, 2 * H)


def _copy[CT: DType](dst: UnsafePointer[Scalar[CT], MutAnyOrigin], src: UnsafePointer[Scalar[CT], MutAnyOrigin], count: Int):
    """`count` elements from `src` to `dst` (apart), a vector at a time."""
    comptime W = 16
    var whole = count - count % W
    for i in range(0, whole, W):
        (dst + i).store((src + i).load[width=W]())
    for i in range(whole, count):
        dst[i] = src[i]


def _first_taken(rows: UnsafePointer[Int64, ImmutAnyOrigin], kept: UnsafePointer[Int64, ImmutAnyOrigin], B: Int, s: Int, T: Int) -> Int:
    """The first position another row takes from row `s` (T where none takes it)."""
    var low = T
    for b in range(B):
        if b != s and Int(rows[b]) == s:
            low = min(low, Int(kept[b]))
    return low


@extensibility.register("gpt2_reorder_rows")
struct ReorderRows:
    @staticmethod
    def execute[
        target: StaticString,
        cache_dtype: DType,
    ](
        cache: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=cache_dtype, rank=5, ...],
        rows: InputTensor[dtype=DType.int64, rank=1, ...],
        kept: InputTensor[dtype=DType.int64, rank=1, ...],
        written: InputTensor[dtype=DType.int64, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_reorder_rows runs on the CPU"
        var B = cache.dim_size(1)
        var H = cache.dim_size(2)
        var M = cache.dim_size(3)
        var d = cache.dim_size(4)
        var T = written.dim_size(1)
        if rows.dim_size(0) != B or kept.dim_size(0) != B or written.dim_size(0) != B or T > M:
            raise Error("gpt2_reorder_rows: rows [B], kept [B] and written [B, T <= M] must fit the cache [2, B, H, M, d]")
        var order = UnsafePointer[Int64, ImmutAnyOrigin](unsafe_from_address=Int(rows.unsafe_ptr()))
        var same = UnsafePointer[Int64, ImmutAnyOrigin](unsafe_from_address=Int(kept.unsafe_ptr()))
        for b in range(B):
            if order[b] < 0 or Int(order[b]) >= B:
                raise Error("gpt2_reorder_rows: every row index must be in 0..B-1")
            if same[b] < 0 or Int(same[b]) > T:
                raise Error("gpt2_reorder_rows: every kept count must be in 0..T")
        var cached = UnsafePointer[Scalar[cache_dtype], MutAnyOrigin](unsafe_from_address=Int(cache.unsafe_ptr()))
        reorder_rows[cache_dtype](cached, order, same, B, H, M, d, T)
