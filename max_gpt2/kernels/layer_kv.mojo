# Where one layer's keys and values lie for each row of a decoding step, so that gpt2_decode_layer
# and gpt2_paged_decode_layer share one body: our own cache [2, B, H, M, d] (row b's past is the
# T - S positions before its S new tokens, padding masked by key_bias [B, T]) or MAX's paged
# blocks [pages, 2, L, page_size, H, d] (row b is request b, its past cache_lengths[b] tokens on
# the pages lookup_table[b, :] names, its new ones input_row_offsets[b]..[b + 1] - 1; no padding).
# gpt2_paged_attention walks MAX's pages through it too, and both paged ops check them in
# `paged_layer_kv`.
from extensibility import IO, InputTensor, IOSpec, ManagedTensorSlice
from std.memory import UnsafePointer

from .attend import F32, HeadCache

comptime U32 = DType.uint32


@always_inline
def _untracked(p: UnsafePointer[UInt32, ImmutAnyOrigin]) -> UnsafePointer[UInt32, MutUntrackedOrigin]:
    return UnsafePointer[UInt32, MutUntrackedOrigin](unsafe_from_address=Int(p))


struct LayerKV[CT: DType](ImplicitlyCopyable):
    """A layer's cache for rows of S new tokens: (row, head) -> `HeadCache`, its past and its key bias."""

    var base: Int  # the address of row 0, head 0's first key
    var row_stride: Int  # elements from one row's keys to the next's (0: rows differ by their pages)
    var head_stride: Int
    var pages: UnsafePointer[UInt32, MutUntrackedOrigin]  # row 0's pages
    var pages_per_row: Int  # 0: every row reads `pages` as row 0 does
    var page_size: Int
    var page_stride: Int
    var slot_stride: Int
    var value_offset: Int
    var cache_lengths: UnsafePointer[UInt32, MutUntrackedOrigin]  # each row's past, when `has_lengths`
    var has_lengths: Bool
    var past_each: Int  # every row's past otherwise
    var key_bias: Int  # the address of [rows, longest] biases, when `has_key_bias`
    var has_key_bias: Bool
    var longest: Int  # the most positions a row attends over: scratch for its scores

    def __init__(
        out self,
        cache: UnsafePointer[Scalar[Self.CT], MutAnyOrigin],
        one_page: UnsafePointer[UInt32, ImmutAnyOrigin],
        key_bias: UnsafePointer[Float32, ImmutAnyOrigin],
        B: Int,
        S: Int,
        H: Int,
        M: Int,
        d: Int,
        T: Int,
    ):
        """Our dense cache [2, B, H, M, d], T positions a row after this step; `one_page` points at a 0."""
        self.base, self.row_stride, self.head_stride = Int(cache), H * M * d, M * d
        self.pages, self.pages_per_row, self.page_size, self.page_stride = _untracked(one_page), 0, M, 0
        self.slot_stride, self.value_offset = d, B * H * M * d
        self.cache_lengths, self.has_lengths, self.past_each = _untracked(one_page), False, T - S
        self.key_bias, self.has_key_bias, self.longest = Int(key_bias), True, T

    def __init__(
        out self,
        blocks: UnsafePointer[Scalar[Self.CT], MutAnyOrigin],
        lookup_table: UnsafePointer[UInt32, ImmutAnyOrigin],
        cache_lengths: UnsafePointer[UInt32, ImmutAnyOrigin],
        offsets: UnsafePointer[UInt32, ImmutAnyOrigin],
        R: Int,
        P: Int,
        L: Int,
        layer: Int,
        page_size: Int,
        page_stride: Int,
        H: Int,
        d: Int,
    ):
        """MAX's paged blocks [pages, 2, L, page_size, H, d] (pages `page_stride` apart) at `layer`, R requests."""
        var slot_stride = H * d
        self.base, self.row_stride, self.head_stride = Int(blocks + layer * page_size * slot_stride), 0, d
        self.pages, self.pages_per_row, self.page_size, self.page_stride = _untracked(lookup_table), P, page_size, page_stride
        self.slot_stride, self.value_offset = slot_stride, L * page_size * slot_stride
        self.cache_lengths, self.has_lengths, self.past_each = _untracked(cache_lengths), True, 0
        self.key_bias, self.has_key_bias = Int(cache_lengths), False  # never read
        var longest = 0
        for r in range(R):
            longest = max(longest, Int(cache_lengths[r]) + Int(offsets[r + 1]) - Int(offsets[r]))
        self.longest = longest

    @always_inline
    def head(self, row: Int, h: Int) -> HeadCache[Self.CT]:
        var first = UnsafePointer[Scalar[Self.CT], MutAnyOrigin](unsafe_from_address=self.base) + row * self.row_stride + h * self.head_stride
        var pages = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(self.pages + row * self.pages_per_row))
        return HeadCache[Self.CT](first, pages, self.page_size, self.page_stride, self.slot_stride, self.value_offset)

    @always_inline
    def past(self, row: Int) -> Int:
        return Int(self.cache_lengths[row]) if self.has_lengths else self.past_each

    @always_inline
    def bias(self, row: Int) -> UnsafePointer[Float32, ImmutAnyOrigin]:
        var biases = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=self.key_bias)
        return biases + row * self.longest if self.has_key_bias else biases


def paged_layer_kv(
    op: String,
    kv_blocks: ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), dtype=F32, rank=6, ...],
    cache_lengths: InputTensor[dtype=U32, rank=1, ...],
    lookup_table: InputTensor[dtype=U32, rank=2, ...],
    input_row_offsets: InputTensor[dtype=U32, rank=1, ...],
    page_stride: InputTensor[dtype=DType.int64, rank=1, ...],
    layer: InputTensor[dtype=U32, rank=1, ...],
) raises -> LayerKV[F32]:
    """MAX's cache at `layer` for the step's requests, once every page they write and read is known to
    lie inside the blocks (`op` names the op in the errors); page_stride -1: pages packed end to end."""
    var L, page_size, H, d = kv_blocks.dim_size(2), kv_blocks.dim_size(3), kv_blocks.dim_size(4), kv_blocks.dim_size(5)
    var R, P, total_pages = cache_lengths.dim_size(0), lookup_table.dim_size(1), kv_blocks.dim_size(0)
    if kv_blocks.dim_size(1) != 2:
        raise Error(op, ": the blocks hold keys and values in dimension 1, of size 2, not ", kv_blocks.dim_size(1))
    if input_row_offsets.dim_size(0) != R + 1 or lookup_table.dim_size(0) != R:
        raise Error(op, ": cache_lengths, lookup_table and row offsets disagree on requests")
    var layer_index = Int(layer[0])
    if layer_index >= L:
        raise Error(op, ": layer ", layer_index, " of a cache of ", L)
    var stride = Int(page_stride[0])
    if stride < 0:
        stride = 2 * L * page_size * H * d
    for r in range(R):
        var seen = Int(cache_lengths[r]) + Int(input_row_offsets[r + 1]) - Int(input_row_offsets[r])
        var needed = (seen + page_size - 1) // page_size
        if needed > P:
            raise Error(op, ": request ", r, " needs ", needed, " pages, its lookup table has ", P)
        for i in range(needed):
            if Int(lookup_table[r, i]) >= total_pages:
                raise Error(op, ": request ", r, " names page ", Int(lookup_table[r, i]), " of ", total_pages)
    var blocks = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(kv_blocks.unsafe_ptr()))
    var pages = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(lookup_table.unsafe_ptr()))
    var cached = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(cache_lengths.unsafe_ptr()))
    var offsets = UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=Int(input_row_offsets.unsafe_ptr()))
    return LayerKV[F32](blocks, pages, cached, offsets, R, P, L, layer_index, page_size, stride, H, d)
