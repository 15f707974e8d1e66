# What the packed matmuls share: the formats, how their weights are laid out and requested ahead, and checks.
#
# Rows are stored 8 at a time, interleaved, so that a group of 8 rows is one stream of memory
# (`max_gpt2.model.formats` lays them out; N is padded to a multiple of 8 with zero rows).
# bfloat16 keeps 32 consecutive values of a row together (K padded to a multiple of 32); q8_0 and
# q4_0 keep 4, so that one SIMD register holds 4 values of each of 8 rows and a multiply-add
# produces 8 rows' partial dot products side by side (K padded to whole blocks):
#
#   bfloat16     bfloat16 [N / 8, Kp * 8]  group g, chunk c, row r, element e (0..31):
#                                          at c * 256 + r * 32 + e = W[8g + r, 32c + e]
#   q8_0 values  uint8 [N / 8, Kb * 256]  int8 bits (every block format's weight is bound as bytes):
#                                          group g, block b, chunk c (0..7), row r, element e (0..3):
#                                          byte (b * 8 + c) * 32 + r * 4 + e = W[8g + r, 32b + 4c + e]
#   q4_0 values  uint8 [N / 8, Kb * 128]  byte (b * 4 + c) * 32 + r * 4 + e holds element 32b + 4c + e
#                                          (low nibble) and 32b + 16 + 4c + e (high nibble) of row 8g + r
#   scales       float16 [N / 8, Kb * 8]  group g, block b, row r: at b * 8 + r
#
# llama.cpp's other blocks of 32 keep q4_0's 4-bit values and add, a block of a group at a time:
#
#   q4_1 values  uint8 [N / 8, Kb * 128]  as q4_0's
#   q5_0, q5_1   uint8 [N / 8, Kb * 160]  at b * 160 the 4-bit q as q4_0's, then at b * 160 + 128 +
#                                          r * 4 + e the 5th bits of elements 32b + 4c + e (bit c)
#                                          and 32b + 16 + 4c + e (bit 4 + c), as q5_k's sub-blocks
#   q5_0 scales  as q4_0's                 (w = d * (q - 16))
#   q4_1, q5_1   float16 [N / 8, Kb * 16]  at b * 16 + r: d of row 8g + r, at b * 16 + 8 + r: m
#                                          (w = d * q + m)
#
# llama.cpp's K-quants hold super-blocks of 256 weights (K a multiple of 256), 8 sub-blocks of 32
# each; a group's super-block s is one run of bytes, its sub-block j's 4-bit values laid out as a
# q4_0 block's (low nibble: element 32j + 4c + e, high: 32j + 16 + 4c + e), then what it adds:
#
#   q4_k bytes   uint8 [N / 8, Ks * 1152]  at s * 1152: 1024 bytes of 4-bit q, then at 1024 + j * 8 + r
#                                          sub-block j's 6-bit scale, at 1088 + j * 8 + r its min
#   q4_k scales  float16 [N / 8, Ks * 16]  at s * 16 + r: d of row 8g + r, at s * 16 + 8 + r: dmin
#                                          (w = d * scale * q - dmin * min)
#   q5_k bytes   uint8 [N / 8, Ks * 1408]  as q4_k's with, after the 4-bit q, at 1024 + j * 32 +
#                                          r * 4 + e the 5th bits of elements 32j + 4c + e (bit c)
#                                          and 32j + 16 + 4c + e (bit 4 + c); then the scales at
#                                          1280 + j * 8 + r, the mins at 1344 + j * 8 + r
#   q5_k scales  float16 [N / 8, Ks * 16]  as q4_k's
#   q6_k bytes   uint8 [N / 8, Ks * 1664]  at s * 1664: the low 4 bits of q as above, then at
#                                          1024 + j * 64 + (c % 2) * 32 + r * 4 + e the high 2 bits
#                                          of elements 32j + 4c + e (bits 4-5 for c < 2, else 0-1)
#                                          and 32j + 16 + 4c + e (bits 6-7, else 2-3); then at
#                                          1536 + i * 8 + r the int8 scale of the 16 weights 16i..
#   q6_k scales  float16 [N / 8, Ks * 8]   at s * 8 + r: d of row 8g + r  (w = d * scale * (q - 32))

from std.sys.info import num_physical_cores, simd_width_of
from std.sys.intrinsics import PrefetchOptions

comptime F32 = DType.float32
# One register's float32 lanes: 16 on AVX-512, 8 on AVX2, where 16 spill skinny_matmul's
# accumulators.
comptime LANES = simd_width_of[F32]()
comptime BLOCK = 32  # weights sharing a scale
comptime GROUP = 8  # rows stored interleaved
comptime CHUNK = 32  # consecutive bfloat16 values of a row stored together: one cache line
comptime PREFETCH_AHEAD = 8192  # bytes of q8_0/q4_0 W requested ahead of the loads
comptime SERIAL_BELOW = 1 << 18  # bytes of W under which one thread does it all

comptime SUPER = 256  # weights of a K-quant super-block
comptime Q8_0 = 1
comptime Q4_0 = 2
comptime Q4_K = 3
comptime Q6_K = 4
comptime Q5_K = 5
comptime Q4_1 = 6
comptime Q5_0 = 7
comptime Q5_1 = 9
# The rounding of x a format's products read: q8_0's own, q4_0's (int8 blocks of 32 with their sums)
# for every block of 4 or 5-bit values, llama.cpp's q8_K (int8 blocks of 256, sums of 16) for the
# K-quants.
comptime Q8_K = 8


def activation_of[FORMAT: Int]() -> Int:
    """The rounding of x that FORMAT's products read (0: x as it is, for float32 and bfloat16)."""
    comptime if is_super[FORMAT]():
        return Q8_K
    elif FORMAT == 0 or FORMAT == Q8_0:
        return FORMAT
    return Q4_0


def has_fifth_bits[FORMAT: Int]() -> Bool:
    """Whether FORMAT's values are 5 bits, the 5th bits stored after the 4-bit ones."""
    return FORMAT == Q5_0 or FORMAT == Q5_1 or FORMAT == Q5_K


def has_min[FORMAT: Int]() -> Bool:
    """Whether FORMAT's scales hold a second float16 a row a block, added (q4_1, q5_1) or, times the
    sub-block mins, subtracted (q4_k, q5_k)."""
    return FORMAT == Q4_1 or FORMAT == Q5_1 or FORMAT == Q4_K or FORMAT == Q5_K


def is_super[FORMAT: Int]() -> Bool:
    """Whether FORMAT is in super-blocks of 256 (the K-quants)."""
    return FORMAT == Q4_K or FORMAT == Q5_K or FORMAT == Q6_K


def requests_ahead[INTO_L1: Bool]() -> PrefetchOptions:
    """How a product requests W ahead of its loads: into L1 and L2 (prefetcht0), or into L2 only
    (prefetcht2; prefetcht1 ran the same). Against one row of x float32, q8_0 and q4_0 stream
    faster with the first, so those ask for it there; bfloat16 against one row and every format
    against several rows ran slower with it (docs/performance.md). Why is not
    known: float32's requests run 64 KB ahead, and most of those lines leave the 32 KB L1 before
    their loads come."""
    return PrefetchOptions().for_read().high_locality() if INTO_L1 else PrefetchOptions().for_read().low_locality()


def row_chunks() -> Int:
    """Chunks of W's rows a product is split into, when it is worth more than one thread: one per
    core. Smaller chunks balance better but cost more hand-offs, and at 1 or 0.56 bytes a weight
    the hand-offs weigh more: more chunks decoded q4_0 slower (docs/performance.md)."""
    return num_physical_cores()


@always_inline
def row_start[WT: DType](n: Int, K: Int) -> Int:
    """Where row n of W starts: row-major float32, or bfloat16 in groups of 8 rows (`GROUP`) of
    `CHUNK`s, its rows padded with zeros to whole chunks."""
    comptime if WT == F32:
        return n * K
    else:
        return (n // GROUP) * GROUP * ((K + CHUNK - 1) // CHUNK * CHUNK) + (n % GROUP) * CHUNK


@always_inline
def block_bytes[FORMAT: Int]() -> Int:
    """Bytes of one block (a super-block for the K-quants) of a group of 8 interleaved rows."""
    comptime if FORMAT == Q8_0:
        return GROUP * BLOCK
    elif FORMAT == Q4_K:
        return 1152
    elif FORMAT == Q5_K:
        return 1408
    elif FORMAT == Q6_K:
        return 1664
    elif FORMAT == Q5_0 or FORMAT == Q5_1:
        return GROUP * BLOCK // 2 + GROUP * 4
    return GROUP * BLOCK // 2


@always_inline
def block_scales[FORMAT: Int]() -> Int:
    """float16 scales of one block (super-block) of a group: one a row, two with a min (d and m, or
    d and dmin)."""
    return 2 * GROUP if has_min[FORMAT]() else GROUP


comptime NIBBLES = 1024  # bytes of a group's K-quant super-block that hold the low 4 bits of q


@always_inline
def fifth_bits_at[FORMAT: Int]() -> Int:
    """Where a group's block (super-block) holds its 5th bits: after the 4-bit values."""
    return NIBBLES if is_super[FORMAT]() else GROUP * BLOCK // 2


@always_inline
def scales_at[FORMAT: Int]() -> Int:
    """Where a group's K-quant super-block holds its scales: after the nibbles and the high bits."""
    comptime if FORMAT == Q5_K:
        return NIBBLES + 256
    elif FORMAT == Q6_K:
        return NIBBLES + 512
    return NIBBLES


@always_inline
def block_weights[FORMAT: Int]() -> Int:
    """Weights of a row in one block: 32, or a super-block's 256."""
    return SUPER if is_super[FORMAT]() else BLOCK


def check_dense(name: String, rows: Int, columns: Int, row_stride: Int, column_stride: Int) raises:
    if column_stride != 1 or row_stride != columns:
        raise Error(name, ": expects dense row-major tensors, got a [", rows, ", ", columns, "] one with strides (", row_stride, ", ", column_stride, ")")


def check_bias(name: String, N: Int, length: Int, stride: Int) raises:
    """A bias is N floats, or none (length 0)."""
    if (length != N and length != 0) or (length > 1 and stride != 1):
        raise Error(name, ": the bias has ", length, " values (stride ", stride, "); the product has ", N, " outputs (or give an empty bias for none)")


def check_blocks[FORMAT: Int](name: String, K: Int, N: Int, w_rows: Int, w_columns: Int, d_rows: Int, d_columns: Int) raises:
    comptime WEIGHTS = block_weights[FORMAT]()
    comptime if is_super[FORMAT]():
        if K % SUPER != 0:
            raise Error(name, ": K = ", K, " is not whole super-blocks of ", SUPER, " weights")
    var blocks = (K + WEIGHTS - 1) // WEIGHTS
    var groups = (N + GROUP - 1) // GROUP
    var columns = blocks * block_bytes[FORMAT]()
    var scales = blocks * block_scales[FORMAT]()
    if w_rows != groups or w_columns != columns or d_rows != groups or d_columns != scales:
        raise Error(name, ": for K = ", K, " and N = ", N, " the values need [", groups, ", ", columns, "] and the scales [", groups, ", ", scales, "]; got [", w_rows, ", ", w_columns, "] and [", d_rows, ", ", d_columns, "]")


def check_chunks(name: String, K: Int, N: Int, w_rows: Int, w_columns: Int) raises:
    """An interleaved bfloat16 W for K inputs and N outputs is [N / 8, Kp * 8]."""
    var groups = (N + GROUP - 1) // GROUP
    var columns = (K + CHUNK - 1) // CHUNK * CHUNK * GROUP
    if w_rows != groups or w_columns != columns:
        raise Error(name, ": for K = ", K, " and N = ", N, " the bfloat16 weight needs [", groups, ", ", columns, "]; got [", w_rows, ", ", w_columns, "]")
