# gpt2_matmul: y[M, N] = x[M, K] @ W[N, K]^T + bias[N] on the CPU, W stored in any weight format, the
# format a compile-time parameter as gpt2_decode_layer takes each product's: 0 for rows of floats
# (float32 [N, K], or bfloat16 in groups: skinny_matmul.mojo), else a block format's code
# (packed_layout.mojo: quantized_matmul.mojo's products). d holds a block format's scales (empty for
# rows of floats); an empty bias is none.
import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .packed_layout import F32
from .quantized_matmul import execute_blocks
from .skinny_matmul import execute_rows


@extensibility.register("gpt2_matmul")
struct Matmul:
    @staticmethod
    def execute[
        target: StaticString,
        weight_dtype: DType,
        format: Int,
    ](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=weight_dtype, rank=2, ...],
        d: InputTensor[dtype=DType.float16, rank=2, ...],
        bias: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "gpt2_matmul runs on the CPU"
        comptime if format == 0:
            comptime assert weight_dtype == F32 or weight_dtype == DType.bfloat16, "rows of float32 or bfloat16"
            execute_rows[weight_dtype, "gpt2_matmul"](y, x, w, bias)
        else:
            comptime assert weight_dtype == DType.uint8, "a block format's weight is bound as bytes"
            execute_blocks[format, "gpt2_matmul"](y, x, w, d, bias)
