# Rows of float32 activations rounded to int8 blocks with a float32 scale each, as llama.cpp
# rounds x before its packed dot products, with the sums and offsets those products take: blocks
# of 32 (q8_0's rounding, `round`) before q8_0 and the 4 and 5-bit blocks of 32, blocks of 256 (q8_K's: x * -127 / the
# largest-magnitude value, rounded half to even, as its `nearest_int`) before the K-quants.
from std.math import round
from std.memory import UnsafePointer, alloc
from std.sys.intrinsics import llvm_intrinsic

from .packed_layout import BLOCK, F32, Q4_0, Q8_0, Q8_K, SUPER


struct QuantizedRows[FORMAT: Int]:
    """Rows of x [M, K] as int8 blocks [M, Kp] and a scale a block, FORMAT the rounding (`Q8_0`, `Q4_0`,
    `Q8_K`: `activation_of`), with what its products take besides: for q8_0 the magnitudes and the
    same + 128, for q4_0 (every 4 or 5-bit block of 32) -8 x the quant sum a block, for q8_K the sums
    of every 16 and every 32 quants (int16: at most 32 * 127)."""

    comptime WIDTH = SUPER if Self.FORMAT == Q8_K else BLOCK  # values a block

    var quants: UnsafePointer[Int8, MutUntrackedOrigin]
    var magnitudes: UnsafePointer[UInt8, MutUntrackedOrigin]  # |q| (q8_0)
    var offset: UnsafePointer[UInt8, MutUntrackedOrigin]  # q + 128, 1..255 (q8_0)
    var scales: UnsafePointer[Float32, MutUntrackedOrigin]
    var q4_offsets: UnsafePointer[Int32, MutUntrackedOrigin]  # -8 * sum(q) (q4_0: values 0..15 stand for -8..7)
    var sums16: UnsafePointer[Int16, MutUntrackedOrigin]  # sum(q) of every 16 (q8_K)
    var sums32: UnsafePointer[Int16, MutUntrackedOrigin]  # sum(q) of every 32 (q8_K)
    var blocks: Int

    var K: Int

    def __init__(out self, M: Int, K: Int):
        """Room for M rows of K values; `quantize` fills it."""
        self.K = K
        self.blocks = (K + Self.WIDTH - 1) // Self.WIDTH
        var values = M * self.blocks * Self.WIDTH
        self.quants = alloc[Int8](values)
        self.magnitudes = alloc[UInt8](values if Self.FORMAT == Q8_0 else 0)
        self.offset = alloc[UInt8](values if Self.FORMAT == Q8_0 else 0)
        self.scales = alloc[Float32](M * self.blocks)
        self.q4_offsets = alloc[Int32](M * self.blocks if Self.FORMAT == Q4_0 else 0)
        self.sums16 = alloc[Int16](values // 16 if Self.FORMAT == Q8_K else 0)
        self.sums32 = alloc[Int16](values // 32 if Self.FORMAT == Q8_K else 0)

    def __init__(out self, x: UnsafePointer[Float32, ImmutAnyOrigin], M: Int, K: Int):
        """x's M rows of K values, quantized."""
        self = Self(M, K)
        self.quantize(x, 0, M)

    def quantize(self, x: UnsafePointer[Float32, ImmutAnyOrigin], first: Int, last: Int):
        """Quantizes x's rows first..last-1 (of K values) into the same rows of this room."""
        comptime if Self.FORMAT == Q8_K:
            self._quantize_super(x, first, last)
            return
        var K = self.K
        for m in range(first, last):
            for b in range(self.blocks):
                var block = SIMD[F32, BLOCK](0)
                var start = b * BLOCK
                if start + BLOCK <= K:
                    block = (x + m * K + start).load[width=BLOCK]()
                else:
                    for i in range(K - start):
                        block[i] = x[m * K + start + i]
                var largest = abs(block).reduce_max()
                var inverse = Float32(0) if largest == 0 else 127 / largest
                var q = round(block * inverse).cast[DType.int32]()
                var at = (m * self.blocks + b) * BLOCK
                (self.quants + at).store(q.cast[DType.int8]())
                self.scales[m * self.blocks + b] = largest / 127
                comptime if Self.FORMAT == Q8_0:
                    (self.magnitudes + at).store(abs(q).cast[DType.uint8]())
                    (self.offset + at).store((q + 128).cast[DType.uint8]())
                else:
                    self.q4_offsets[m * self.blocks + b] = -8 * q.reduce_add()

    def _quantize_super(self, x: UnsafePointer[Float32, ImmutAnyOrigin], first: Int, last: Int):
        """q8_K's rounding of x's rows first..last-1 (K whole blocks of 256): llama.cpp's
        `quantize_row_q8_K_ref`, 16 values at a time (one sum each)."""
        var K = self.K
        for m in range(first, last):
            for b in range(self.blocks):
                var values = x + m * K + b * SUPER
                var magnitude = SIMD[F32, 16](0)
                comptime for i in range(SUPER // 16):
                    magnitude = max(magnitude, abs((values + 16 * i).load[width=16]()))
                var largest_magnitude = magnitude.reduce_max()
                var largest = Float32(0)  # the first value of that magnitude, with its sign
                for i in range(SUPER):
                    if abs(values[i]) == largest_magnitude:
                        largest = values[i]
                        break
                var at = (m * self.blocks + b) * SUPER
                var inverse = Float32(0) if largest == 0 else -127 / largest
                self.scales[m * self.blocks + b] = Float32(0) if largest == 0 else 1 / inverse
                var first_half = Int32(0)
                comptime for i in range(SUPER // 16):
                    var scaled = (values + 16 * i).load[width=16]() * inverse
                    var q = min(llvm_intrinsic["llvm.roundeven", SIMD[F32, 16]](scaled).cast[DType.int32](), 127)
                    (self.quants + at + 16 * i).store(q.cast[DType.int8]())
                    var total = q.reduce_add()
                    self.sums16[at // 16 + i] = total.cast[DType.int16]()
                    comptime if i % 2 == 1:
                        self.sums32[at // 32 + i // 2] = (first_half + total).cast[DType.int16]()
                    first_half = total

    def free(self):
        self.quants.free()
        self.magnitudes.free()
        self.offset.free()
        self.scales.free()
        self.q4_offsets.free()
        self.sums16.free()
        self.sums32.free()
