"""`Linear` with its weight stored in a decoding format: bfloat16, q8_0 or q4_0 (`weight_formats`).

Parameters, for `out` outputs and `in` inputs (Kp = `in` rounded up to blocks of 32):

    bfloat16  weight bfloat16 [out, in]
    q8_0      weight int8 [out, Kp], scales float16 [out, Kp / 32]
    q4_0      weight uint8 [out, Kp / 2] (two 4-bit values a byte), scales float16 [out, Kp / 32]
    bias      float32 [out], as `Linear`'s

With `kernels` (the decoding steps) the product runs through the packed Mojo
kernels, which read each weight once in its packed bytes; without (prompts, and
attention maps) the weight is unpacked to float32 and multiplied by MAX's matmul.
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Module
from max.experimental.tensor import Tensor

from max_gpt2.kernels import dequantize, packed_matmul
from max_gpt2.model.weight_formats import BLOCK

_WEIGHT_DTYPES = {"bfloat16": DType.bfloat16, "q8_0": DType.int8, "q4_0": DType.uint8}


class PackedLinear(Module[[Tensor], Tensor]):
    """`x @ W^T + b` with W packed in `format`; `[..., in]` -> `[..., out]`."""

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True, format: str, kernels: bool) -> None:
        self.format, self.kernels, self.in_dim = format, kernels, in_dim
        padded = -(-in_dim // BLOCK) * BLOCK
        columns = {"bfloat16": in_dim, "q8_0": padded, "q4_0": padded // 2}[format]
        self.weight = Tensor.zeros([out_dim, columns], dtype=_WEIGHT_DTYPES[format])
        if format != "bfloat16":
            self.scales = Tensor.zeros([out_dim, padded // BLOCK], dtype=DType.float16)
        self.bias = Tensor.zeros([out_dim], dtype=DType.float32) if bias else 0

    def forward(self, x: Tensor) -> Tensor:
        out_dim = self.weight.shape[0]
        scales = None if self.format == "bfloat16" else self.scales
        rows = x.reshape([-1, self.in_dim])  # [M, in]
        if self.kernels:
            y = packed_matmul(rows, self.weight, scales, self.format)
        else:
            weight = (
                F.cast(self.weight, DType.float32)
                if scales is None
                else dequantize(self.weight, scales, self.format, self.in_dim)
            )
            y = rows @ weight.T
        return (y + self.bias).reshape([*x.shape[:-1], out_dim])
