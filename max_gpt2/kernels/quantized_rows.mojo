# Rows of float32 activations rounded to int8 blocks of 32 with a float32 scale each, as llama.cpp
# rounds x before its q8_0 and q4_0 dot products, with the sums and offsets those products take.
from std.math import round
from std.memory import UnsafePointer, alloc

from .packed_layout import BLOCK, F32, Q4_0, Q8_0


struct QuantizedRows[FORMAT: Int]:
    """Rows of x [M, K] as int8 blocks of 32 [M, Kp] and a scale a block, with what FORMAT's products
    take besides: for q8_0 the magnitudes and the same + 128, for q4_0 -8 x the quant sum a block."""

    var quants: UnsafePointer[Int8, MutUntrackedOrigin]
    var magnitudes: UnsafePointer[UInt8, MutUntrackedOrigin]  # |q| (q8_0)
    var offset: UnsafePointer[UInt8, MutUntrackedOrigin]  # q + 128, 1..255 (q8_0)
    var scales: UnsafePointer[Float32, MutUntrackedOrigin]
    var q4_offsets: UnsafePointer[Int32, MutUntrackedOrigin]  # -8 * sum(q) (q4_0: values 0..15 stand for -8..7)
    var blocks: Int

    var K: Int

    def __init__(out self, M: Int, K: Int):
        """Room for M rows of K values; `quantize` fills it."""
        self.K = K
        self.blocks = (K + BLOCK - 1) // BLOCK
        var values = M * self.blocks * BLOCK
        self.quants = alloc[Int8](values)
        self.magnitudes = alloc[UInt8](values if Self.FORMAT == Q8_0 else 0)
        self.offset = alloc[UInt8](values if Self.FORMAT == Q8_0 else 0)
        self.scales = alloc[Float32](M * self.blocks)
        self.q4_offsets = alloc[Int32](M * self.blocks if Self.FORMAT == Q4_0 else 0)

    def __init__(out self, x: UnsafePointer[Float32, ImmutAnyOrigin], M: Int, K: Int):
        """x's M rows of K values, quantized."""
        self = Self(M, K)
        self.quantize(x, M)

    def quantize(self, x: UnsafePointer[Float32, ImmutAnyOrigin], M: Int):
        """Quantizes x's M rows (of K values) into this room."""
        var K = self.K
        for m in range(M):
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

    def free(self):
        self.quants.free()
        self.magnitudes.free()
        self.offset.free()
        self.scales.free()
        self.q4_offsets.free()
