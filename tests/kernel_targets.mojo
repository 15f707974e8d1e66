# The decoding step's kernels instantiated for `mojo build --emit asm` (tests/test_kernel_targets.py):
# gpt2_decode_layer's body in every weight format (a float32 cache beside float32 weights, float16
# beside each, q4_k_m's mix of q6_k and q4_k, the other blocks of 32 mixed, q8_0 beside q5_0 too) and
# the LM head's products. Never run: its pointers and sizes come from the command line, so the
# compiler must keep every path.
from std.memory import UnsafePointer
from std.sys import argv

from kernels.attend import ROW
from kernels.decode_layer import LayerWeights, decode_layer
from kernels.layer_kv import LayerKV
from kernels.layer_products import Product
from kernels.packed_layout import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from kernels.quantized_matmul import packed_matmul_blocks
from kernels.skinny_matmul import dense_matmul


def layer[WT: DType, CT: DType, FORMAT: Int, SIDE: Int = FORMAT](address: Int, n: Int):
    """A block of n rows, width n, at `address` (weights, cache and activations alike): c_attn and
    mlp c_proj in SIDE, the other two in FORMAT."""
    var product = Product[WT, FORMAT](address, address, address, True, n, n)
    var side = Product[WT, SIDE](address, address, address, True, n, n)
    var weights = LayerWeights[WT, SIDE, FORMAT, FORMAT, SIDE](SIMD[DType.int64, 4](Int64(address)), 1e-5, side, product, product, side)
    var kv = LayerKV[CT](
        UnsafePointer[Scalar[CT], MutAnyOrigin](unsafe_from_address=address),
        UnsafePointer[UInt32, ImmutAnyOrigin](unsafe_from_address=address),
        UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=address),
        n, 1, n, n, ROW, n,
    )
    var x = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=address)
    decode_layer[CT, ROW](x, UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=address), kv, weights, n, 1, n, ROW)


def main() raises:
    var address = Int(argv()[1])
    var n = Int(argv()[2])
    layer[DType.float32, DType.float32, 0](address, n)
    layer[DType.float32, DType.float16, 0](address, n)
    layer[DType.bfloat16, DType.float16, 0](address, n)
    layer[DType.uint8, DType.float16, Q8_0](address, n)
    layer[DType.uint8, DType.float16, Q4_0](address, n)
    layer[DType.uint8, DType.float16, Q4_K, Q6_K](address, n)
    layer[DType.uint8, DType.float16, Q4_1, Q5_1](address, n)
    layer[DType.uint8, DType.float16, Q5_0, Q8_0](address, n)
    var x = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=address)
    var y = UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=address)
    var bytes = UnsafePointer[UInt8, ImmutAnyOrigin](unsafe_from_address=address)
    var scales = UnsafePointer[Float16, ImmutAnyOrigin](unsafe_from_address=address)
    dense_matmul[DType.float32](x, UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=address), x, False, y, n, n, n)
    dense_matmul[DType.bfloat16](x, UnsafePointer[BFloat16, ImmutAnyOrigin](unsafe_from_address=address), x, False, y, n, n, n)
    packed_matmul_blocks[Q8_0](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q4_0](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q4_1](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q5_0](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q5_1](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q4_K](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q5_K](x, bytes, scales, x, False, y, n, n, n)
    packed_matmul_blocks[Q6_K](x, bytes, scales, x, False, y, n, n, n)
