"""`Linear` with its weight stored in a decoding format: bfloat16, q8_0 or q4_0 (`weight_formats`).

Its parameters are what the format says a linear layer stores (`WeightFormat.stored`): a packed
"weight" and, for block formats, "scales", in the kernels' layout; the bias is float32 [out], as
`Linear`'s. With `kernels` (the decoding steps) the product runs through the format's Mojo op,
which reads each weight once in its packed bytes; without (prompts, and attention maps) the weight
is unpacked to float32 and multiplied by MAX's matmul.
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Module
from max.experimental.tensor import Tensor

from max_gpt2.kernels import StoredProduct, dequantize, packed_matmul
from max_gpt2.model.kernel_layout import CHUNK, GROUP
from max_gpt2.model.weight_formats import WeightFormat


class PackedLinear(Module[[Tensor], Tensor]):
    """`x @ W^T + b` with W packed in `format`; `[..., in]` -> `[..., out]`."""

    def __init__(
        self, in_dim: int, out_dim: int, *, bias: bool = True, format: WeightFormat, kernels: bool
    ) -> None:
        self.kernels, self.in_dim, self.out_dim = kernels, in_dim, out_dim
        self.take_format(format)
        self.bias = Tensor.zeros([out_dim], dtype=DType.float32) if bias else 0

    def take_format(self, format: WeightFormat) -> None:
        """Stores W in `format` from now on: its parameters made anew, as that format stores them."""
        self.format = format
        stored = format.stored(self.out_dim, self.in_dim)
        self.weight = Tensor.zeros(list(stored["weight"].shape), dtype=stored["weight"].max_dtype)
        if "scales" in stored:
            self.scales = Tensor.zeros(list(stored["scales"].shape), dtype=stored["scales"].max_dtype)
        elif hasattr(self, "scales"):
            del self.scales

    def forward(self, x: Tensor) -> Tensor:
        product = self.stored()
        rows = x.reshape([-1, self.in_dim])  # [M, in]
        if self.kernels:
            y = packed_matmul(
                rows, product.weight, product.scales, self.format.matmul_op, self.out_dim, product.bias
            )
            return y.reshape([*x.shape[:-1], self.out_dim])
        if product.scales is None:
            y = rows @ F.cast(self._deinterleaved(), DType.float32).T
        else:
            op = self.format.dequantize_op
            y = rows @ dequantize(product.weight, product.scales, op, self.out_dim, self.in_dim).T
        return (y + self.bias).reshape([*x.shape[:-1], self.out_dim])

    def stored(self) -> StoredProduct:
        """The product as `gpt2_decode_layer` takes it: the packed weight, its scales (None without), the
        bias (None without)."""
        scales = getattr(self, "scales", None)
        bias = self.bias if isinstance(self.bias, Tensor) else None
        return StoredProduct(self.weight, scales, bias, self.format.kernel_format)

    def _deinterleaved(self) -> Tensor:
        """The bfloat16 weight back in rows, [out, in]."""
        groups, chunks = int(self.weight.shape[0]), int(self.weight.shape[1]) // (GROUP * CHUNK)
        grouped = self.weight.reshape([groups, chunks, GROUP, CHUNK]).permute([0, 2, 1, 3])  # [G, r, c, e]
        return grouped.reshape([groups * GROUP, chunks * CHUNK])[: self.out_dim, : self.in_dim]


def take_formats(model: Module, weight_format: WeightFormat) -> None:
    """Each `PackedLinear` of `model` in the format `weight_format` gives its weight (`format_for`: a
    file's mix of formats gives each tensor its own)."""
    for name, module in model.descendants:
        if (
            isinstance(module, PackedLinear)
            and (own := weight_format.format_for(f"{name}.weight")) is not module.format
        ):
            module.take_format(own)  # built in another: made anew


def formats_named(module: Module) -> str:
    """The formats of `module`'s `PackedLinear`s in order, joined ("" without any): what tells blocks
    stored differently apart, so that each way compiles as a subgraph of its own."""
    return "_".join(child.format.name for _, child in module.descendants if isinstance(child, PackedLinear))
