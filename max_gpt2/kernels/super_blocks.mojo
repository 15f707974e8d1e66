# The products of llama.cpp's K-quants, q4_k, q5_k and q6_k (super-blocks of 256 weights; layout in
# packed_layout.mojo), against x rounded to q8_K (quantized_rows.mojo), as llama.cpp computes them:
# each sub-block's integer dot products times its integer scale, summed over the super-block, then
# one float multiply by d (and dmin) times x's scale.
#
#   q4_k   w = d * scale_j * q - dmin * min_j        q 0..15, scale and min 0..63 per 32 weights
#   q5_k   the same, q 0..31
#   q6_k   w = d * scale_i * (q - 32)                q 0..63, int8 scale per 16 weights
#
# The offsets come off once a super-block through x's sums (int16): min_j * sum(xq) over sub-block j,
# 32 * scale_i * sum(xq) over each 16, two sub-blocks' a vpmaddwd (W's mins or scales of two
# sub-blocks side by side against x's two sums). q4_k and q5_k sum in int32 (at most
# 63 * 31 * 127 * 256); q6_k's scale x dot of each 16 (at most 128 * 63 * 127 * 16 < 2^24) is exact in
# float32, where it is summed.
from std.collections import Array
from std.memory import UnsafePointer, alloc
from std.sys.info import CompilationTarget
from std.sys.intrinsics import prefetch

from .byte_products import dot4_add, repeat2, repeat4, side_by_side, word_products
from .epilogue import finish_rows
from .packed_layout import F32, GROUP, NIBBLES, PREFETCH_AHEAD, Q6_K, Q8_K, SUPER, block_bytes, block_scales, fifth_bits_at, has_fifth_bits, is_super, requests_ahead, scales_at
from .quantized_rows import QuantizedRows

comptime UNPACKED_BYTES = 8 * 4 * 64  # a group's super-block's 8 sub-blocks of 4 chunks, unpacked
comptime UNPACK_FROM = 32  # rows of x from which q5_k and q6_k unpack a group once (docs/performance.md)
comptime PAIRED_FROM = 4  # rows of x from which two groups go side by side (docs/performance.md)


@always_inline
def _chunk_quants[
    FORMAT: Int, GROUPS: Int, j: Int, c: Int
](block: UnsafePointer[UInt8, ImmutAnyOrigin], next_group: Int) -> SIMD[DType.uint8, 64 * GROUPS]:
    """Sub-block j's chunk c of GROUPS groups' super-blocks (the second `next_group` bytes on) as
    integers (0..15, 0..31 or 0..63): bytes 0..32 * GROUPS - 1 hold element 32j + 4c + e of row r at
    4r + e (a group's 8 rows, then the next's), the others element 32j + 16 + 4c + e."""
    var raw = side_by_side[DType.uint8, 32, GROUPS](block + j * 128 + c * 32, next_group)
    var low = raw & 0xF
    var high = raw >> 4
    comptime if has_fifth_bits[FORMAT]():
        var fifth = side_by_side[DType.uint8, 32, GROUPS](block + fifth_bits_at[FORMAT]() + j * 32, next_group)  # bit c, and 4 + c
        low |= (fifth << UInt8(4 - c)) & 0x10
        high |= (fifth >> UInt8(c)) & 0x10
    elif FORMAT == Q6_K:
        # chunks c and c + 2 share a byte of high bits: bits 4-7 for c < 2, 0-3 for the others
        var top = side_by_side[DType.uint8, 32, GROUPS](block + NIBBLES + j * 64 + (c % 2) * 32, next_group)
        comptime if c < 2:
            low |= top & 0x30
            high |= (top >> 2) & 0x30
        else:
            low |= (top << 4) & 0x30
            high |= (top << 2) & 0x30
    return low.join(high)


@always_inline
def _request_lines[FORMAT: Int, GROUPS: Int, j: Int](block: UnsafePointer[UInt8, ImmutAnyOrigin], next_group: Int):
    """Sub-block j's eighth of the cache lines of each group's super-block, requested ahead into L2:
    into L1, as q4_0 and q8_0 ask against one row, decoding streamed q6_k at half the speed
    (docs/performance.md)."""
    comptime LINES = block_bytes[FORMAT]() // 64
    comptime for group in range(GROUPS):
        comptime for line in range(j * LINES // 8, (j + 1) * LINES // 8):
            prefetch[requests_ahead[False]()](block + group * next_group + PREFETCH_AHEAD + 64 * line)


def _unpack_groups[
    FORMAT: Int, GROUPS: Int
](group: UnsafePointer[UInt8, ImmutAnyOrigin], nb: Int, unpacked: UnsafePointer[UInt8, MutUntrackedOrigin]):
    """GROUPS groups' nb super-blocks as `_chunk_quants` gives them, `GROUPS * UNPACKED_BYTES` a
    super-block: chunk (j, c) of super-block s at GROUPS * (s * UNPACKED_BYTES + 64 * (4j + c))."""
    comptime BYTES = block_bytes[FORMAT]()
    for s in range(nb):
        var block = group + s * BYTES
        comptime for j in range(8):
            _request_lines[FORMAT, GROUPS, j](block, nb * BYTES)
            comptime for c in range(4):
                var at = unpacked + GROUPS * (s * UNPACKED_BYTES + (j * 4 + c) * 64)
                at.store(_chunk_quants[FORMAT, GROUPS, j, c](block, nb * BYTES))


@always_inline
def _group_super_blocks[
    X: Int, //, FORMAT: Int, GROUPS: Int, MB: Int, EPILOGUE: Int, UNPACKED: Bool
](
    unpacked: UnsafePointer[UInt8, ImmutAnyOrigin],
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[X],
    m0: Int,
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    N: Int,
    g: Int,
):
    """y[m0 + m, 8g + r] for m < MB, r < 8 * GROUPS (those below N): groups g.. g + GROUPS - 1 of W's
    rows against MB rows of x, plus bias[8g + r] where there is a bias; with UNPACKED their integers
    read from `unpacked` (`_unpack_groups`), else taken out of W's bytes here."""
    comptime BYTES = block_bytes[FORMAT]()
    comptime SCALES = block_scales[FORMAT]()
    comptime L = GROUP * GROUPS  # lanes: one a row of W
    comptime HALF = 32 * GROUPS  # bytes of a chunk's lows (or highs)
    var nb = xq.blocks
    var next_group = nb * BYTES  # bytes from a group's super-block to the next group's
    var group = w + g * next_group
    var acc = Array[SIMD[F32, L], MB](fill=SIMD[F32, L](0))
    for s in range(nb):
        var block = group + s * BYTES
        var sums = Array[SIMD[F32, L], MB](fill=SIMD[F32, L](0))  # scale x dot (q6_k)
        var whole = Array[SIMD[DType.int32, L], MB](fill=SIMD[DType.int32, L](0))  # scale x dot (q4_k)
        comptime for j in range(8):  # sub-blocks of 32
            comptime if not UNPACKED:
                _request_lines[FORMAT, GROUPS, j](block, next_group)
            var lows = Array[SIMD[DType.int32, L], MB](fill=SIMD[DType.int32, L](0))
            var highs = Array[SIMD[DType.int32, L], MB](fill=SIMD[DType.int32, L](0))
            comptime for c in range(4):
                var both: SIMD[DType.uint8, 2 * HALF]
                comptime if UNPACKED:
                    both = (unpacked + GROUPS * (s * UNPACKED_BYTES + (j * 4 + c) * 64)).load[width=2 * HALF]()
                else:
                    both = _chunk_quants[FORMAT, GROUPS, j, c](block, next_group)
                var low = both.slice[HALF]()  # element 32j + 4c + e of row r, at lane 4r + e
                var high = both.slice[HALF, offset=HALF]()  # element 32j + 16 + 4c + e
                comptime for m in range(MB):
                    var quants = xq.quants + ((m0 + m) * nb + s) * SUPER + 32 * j
                    lows[m] = dot4_add[L](lows[m], low, repeat4[DType.int8, L](quants + 4 * c))
                    highs[m] = dot4_add[L](highs[m], high, repeat4[DType.int8, L](quants + 16 + 4 * c))
            comptime if FORMAT == Q6_K:
                # Each 16's scale applied in float32 (exact: |scale x dot| < 2^24), which measured faster
                # than int32 multiplies (docs/performance.md).
                var scales = (block + scales_at[FORMAT]() + 16 * j).bitcast[Int8]()
                var first = side_by_side[DType.int8, GROUP, GROUPS](scales, next_group).cast[F32]()
                var second = side_by_side[DType.int8, GROUP, GROUPS](scales + 8, next_group).cast[F32]()
                comptime for m in range(MB):
                    sums[m] = lows[m].cast[F32]().fma(first, sums[m])
                    sums[m] = highs[m].cast[F32]().fma(second, sums[m])
            else:
                var scale = side_by_side[DType.uint8, GROUP, GROUPS](block + scales_at[FORMAT]() + 8 * j, next_group)
                comptime for m in range(MB):
                    whole[m] += scale.cast[DType.int32]() * (lows[m] + highs[m])
        # The offsets: q6_k's scales of 16 (or q4_k's and q5_k's mins of 32) two at a time, row r's two
        # side by side at lanes 2r and 2r + 1, against x's two sums over the same weights.
        comptime PAIRS = 8 if FORMAT == Q6_K else 4
        comptime EACH = 2 * PAIRS  # x's sums a super-block
        var offsets = Array[SIMD[DType.int32, L], MB](fill=SIMD[DType.int32, L](0))
        comptime PER_WEIGHTS = DType.int8 if FORMAT == Q6_K else DType.uint8  # int8 scales, or mins 0..63
        var per_weights = (block + scales_at[FORMAT]() + (0 if FORMAT == Q6_K else 64)).bitcast[Scalar[PER_WEIGHTS]]()
        comptime for p in range(PAIRS):
            var first = side_by_side[PER_WEIGHTS, GROUP, GROUPS](per_weights + 16 * p, next_group).cast[DType.int16]()
            var second = side_by_side[PER_WEIGHTS, GROUP, GROUPS](per_weights + 16 * p + 8, next_group).cast[DType.int16]()
            var both = first.interleave(second)
            comptime for m in range(MB):
                var x_sums = (xq.sums16 if FORMAT == Q6_K else xq.sums32) + ((m0 + m) * nb + s) * EACH + 2 * p
                offsets[m] += word_products[L](rebind[SIMD[DType.int16, 2 * L]](both), repeat2[L](x_sums))
        var steps_at = d + (g * nb + s) * SCALES
        var steps = side_by_side[DType.float16, GROUP, GROUPS](steps_at, nb * SCALES).cast[F32]()
        comptime for m in range(MB):
            var x_scale = xq.scales[(m0 + m) * nb + s]
            comptime if FORMAT == Q6_K:
                acc[m] = (sums[m] - (32 * offsets[m]).cast[F32]()).fma(steps * x_scale, acc[m])
            else:
                acc[m] = whole[m].cast[F32]().fma(steps * x_scale, acc[m])
                var least_steps = side_by_side[DType.float16, GROUP, GROUPS](steps_at + GROUP, nb * SCALES).cast[F32]()
                acc[m] = offsets[m].cast[F32]().fma(-least_steps * x_scale, acc[m])
    finish_rows[EPILOGUE, L, MB](acc, bias, has_bias, y, m0, N, g * GROUP)


@always_inline
def _groups_against_rows[
    X: Int, //, FORMAT: Int, GROUPS: Int, EPILOGUE: Int
](
    unpacked: UnsafePointer[UInt8, MutUntrackedOrigin],
    unpacks: Bool,
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[X],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    N: Int,
    g: Int,
):
    """Groups g.. g + GROUPS - 1 of W's rows against all M rows of x: 8 rows at a time, then 4, 2, 1;
    with `unpacks`, their integers first taken out once into `unpacked`."""
    var nb = xq.blocks
    var kept = UnsafePointer[UInt8, ImmutAnyOrigin](unsafe_from_address=Int(unpacked))
    if unpacks:
        _unpack_groups[FORMAT, GROUPS](w + g * nb * block_bytes[FORMAT](), nb, unpacked)
    var m = 0
    comptime for halving in range(4):
        comptime MB = 8 >> halving
        while M - m >= MB:
            if unpacks:
                _group_super_blocks[FORMAT, GROUPS, MB, EPILOGUE, True](kept, w, d, xq, m, bias, has_bias, y, N, g)
            else:
                _group_super_blocks[FORMAT, GROUPS, MB, EPILOGUE, False](kept, w, d, xq, m, bias, has_bias, y, N, g)
            m += MB


def super_block_groups[
    X: Int, //, FORMAT: Int, EPILOGUE: Int
](
    w: UnsafePointer[UInt8, ImmutAnyOrigin],
    d: UnsafePointer[Float16, ImmutAnyOrigin],
    xq: QuantizedRows[X],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    N: Int,
    first: Int,
    last: Int,
):
    """Groups first..last-1 of W's rows (8 outputs each) against the M rows of `xq`, written into
    y [M, N] as EPILOGUE says: up to 8 rows of x at a time, while a group's super-blocks are in cache."""
    comptime assert is_super[FORMAT](), "super-blocks are q4_k's, q5_k's and q6_k's"
    comptime assert X == Q8_K, "the K-quants read x rounded to q8_K"
    # From UNPACK_FROM rows of x, q5_k's and q6_k's integers are taken out of a group's bytes once, not
    # once each 8 rows; q4_k's two operations a chunk cost less than the loads that would replace them.
    var unpacks = M >= UNPACK_FROM and (has_fifth_bits[FORMAT]() or FORMAT == Q6_K)
    # With AVX-512 VNNI, two groups side by side (16 lanes) halve the multiply-adds against many rows
    # of x; against few, W's two streams cost more than that saves (docs/performance.md).
    comptime PAIRED = CompilationTarget.has_avx512f() and CompilationTarget.has_vnni()
    var unpacked = alloc[UInt8](xq.blocks * UNPACKED_BYTES * (2 if PAIRED else 1) if unpacks else 1)
    var g = first
    comptime if PAIRED:
        while g + 1 < last and M >= PAIRED_FROM:
            _groups_against_rows[FORMAT, 2, EPILOGUE](unpacked, unpacks, w, d, xq, bias, has_bias, y, M, N, g)
            g += 2
    while g < last:
        _groups_against_rows[FORMAT, 1, EPILOGUE](unpacked, unpacks, w, d, xq, bias, has_bias, y, M, N, g)
        g += 1
    unpacked.free()
