"""`Linear` with its weight stored in a decoding format: bfloat16, q8_0 or q4_0 (`weight_formats`).

Parameters, for `out` outputs and `in` inputs (Kb blocks of 32 inputs, G groups of 8
outputs; the layouts are `max_gpt2.model.weight_formats`'):

    bfloat16  weight bfloat16 [G, Kb * 256]
    q8_0      weight int8 [G, Kb * 256], scales float16 [G, Kb * 8]
    q4_0      weight uint8 [G, Kb * 128] (two 4-bit values a byte), scales float16 [G, Kb * 8]
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

from max_gpt2.kernels import StoredProduct, dequantize, packed_matmul
from max_gpt2.model.weight_formats import BLOCK, CHUNK, GROUP


class PackedLinear(Module[[Tensor], Tensor]):
    """`x @ W^T + b` with W packed in `format`; `[..., in]` -> `[..., out]`."""

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True, format: str, kernels: bool) -> None:
        self.format, self.kernels, self.in_dim, self.out_dim = format, kernels, in_dim, out_dim
        blocks, groups = -(-in_dim // BLOCK), -(-out_dim // GROUP)
        if format == "bfloat16":
            self.weight = Tensor.zeros([groups, -(-in_dim // CHUNK) * GROUP * CHUNK], dtype=DType.bfloat16)
        else:
            per_block = GROUP * BLOCK if format == "q8_0" else GROUP * BLOCK // 2
            dtype = DType.int8 if format == "q8_0" else DType.uint8
            self.weight = Tensor.zeros([groups, blocks * per_block], dtype=dtype)
            self.scales = Tensor.zeros([groups, blocks * GROUP], dtype=DType.float16)
        self.bias = Tensor.zeros([out_dim], dtype=DType.float32) if bias else 0

    def forward(self, x: Tensor) -> Tensor:
        scales = None if self.format == "bfloat16" else self.scales
        rows = x.reshape([-1, self.in_dim])  # [M, in]
        if self.kernels:
            bias = self.bias if isinstance(self.bias, Tensor) else None
            y = packed_matmul(rows, self.weight, scales, self.format, self.out_dim, bias)
            return y.reshape([*x.shape[:-1], self.out_dim])
        if scales is None:
            y = rows @ F.cast(self._deinterleaved(), DType.float32).T
        else:
            y = rows @ dequantize(self.weight, scales, self.format, self.out_dim, self.in_dim).T
        return (y + self.bias).reshape([*x.shape[:-1], self.out_dim])

    def stored(self) -> StoredProduct:
        """The product as `gpt2_decode_layer` takes it: the packed weight, its scales (None for
        bfloat16), the bias (None without)."""
        scales = None if self.format == "bfloat16" else self.scales
        return StoredProduct(self.weight, scales, self.bias if isinstance(self.bias, Tensor) else None)

    def _deinterleaved(self) -> Tensor:
        """The bfloat16 weight back in rows, [out, in]."""
        groups, chunks = int(self.weight.shape[0]), int(self.weight.shape[1]) // (GROUP * CHUNK)
        grouped = self.weight.reshape([groups, chunks, GROUP, CHUNK]).permute([0, 2, 1, 3])  # [G, r, c, e]
        return grouped.reshape([groups * GROUP, chunks * CHUNK])[: self.out_dim, : self.in_dim]
