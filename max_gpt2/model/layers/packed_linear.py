"""`Linear` and `Embedding` with their weight stored in a decoding format (`max_gpt2.model.formats`).

A `PackedLinear`'s parameters are what the format says a linear layer stores (`TensorFormat.stored`):
a packed "weight" and, for block formats, "scales", in the kernels' layout; the bias is float32
[out], as `Linear`'s. With `kernels` (the decoding steps) the product runs through the format's
Mojo op, which reads each weight once in its packed bytes; without (prompts, and attention maps)
the weight is unpacked to float32 and multiplied by MAX's matmul.

A `PackedEmbedding` stores its table [V, D] as a `PackedLinear` of V outputs does (a tied LM head's
very arrays, `stored_weights.aliases`) and unpacks only the groups of 8 rows its ids fall in.
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Module
from max.experimental.tensor import Tensor

from max_gpt2.kernels import StoredProduct, dequantize, packed_matmul
from max_gpt2.model.formats import TensorFormat, WeightFormat
from max_gpt2.model.formats.kernel_layout import CHUNK, GROUP


class PackedLinear(Module[[Tensor], Tensor]):
    """`x @ W^T + b` with W packed in `format`; `[..., in]` -> `[..., out]`."""

    def __init__(
        self, in_dim: int, out_dim: int, *, bias: bool = True, format: TensorFormat, kernels: bool
    ) -> None:
        self.kernels, self.in_dim, self.out_dim = kernels, in_dim, out_dim
        self.take_format(format)
        self.bias = Tensor.zeros([out_dim], dtype=DType.float32) if bias else 0

    def take_format(self, format: TensorFormat) -> None:
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
                rows, product.weight, product.scales, product.format, self.out_dim, product.bias
            )
            return y.reshape([*x.shape[:-1], self.out_dim])
        y = rows @ self.unpacked(product.weight, product.scales)[: self.out_dim].T
        return (y + self.bias).reshape([*x.shape[:-1], self.out_dim])

    def unpacked(self, weight: Tensor, scales: Tensor | None) -> Tensor:
        """Groups of 8 rows of the packed weight, [G, ...] (and their scales), -> float32 [G * 8, in]."""
        groups = weight.shape[0]
        if scales is None:  # bfloat16, interleaved in chunks (`kernel_layout`)
            chunks = int(weight.shape[1]) // (GROUP * CHUNK)
            grouped = weight.reshape([groups, chunks, GROUP, CHUNK]).permute([0, 2, 1, 3])  # [G, r, c, e]
            rows = grouped.reshape([groups * GROUP, chunks * CHUNK])[:, : self.in_dim]
            return F.cast(rows, DType.float32)
        return dequantize(weight, scales, self.format.kernel_format, groups * GROUP, self.in_dim)

    def stored(self) -> StoredProduct:
        """The product as `gpt2_decode_layer` takes it: the packed weight, its scales (None without), the
        bias (None without)."""
        scales = getattr(self, "scales", None)
        bias = self.bias if isinstance(self.bias, Tensor) else None
        return StoredProduct(self.weight, scales, bias, self.format.kernel_format)


class PackedEmbedding(PackedLinear):
    """`Embedding` with its table [V, D] packed in `format`: ids [...] int64 -> [..., D] float32."""

    def __init__(self, vocab_size: int, dim: int, *, format: TensorFormat) -> None:
        super().__init__(dim, vocab_size, bias=False, format=format, kernels=False)

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape([-1])  # [M]
        groups = flat // GROUP  # [M]: the group of 8 rows each id lies in
        scales = getattr(self, "scales", None)
        picked = None if scales is None else F.gather(scales, groups, axis=0)
        rows = self.unpacked(F.gather(self.weight, groups, axis=0), picked)  # [M * 8, D]
        within = F.unsqueeze(flat % GROUP, -1)  # [M, 1]
        looked_up = F.gather_nd(rows.reshape([-1, GROUP, self.in_dim]), within, batch_dims=1)  # [M, D]
        return looked_up.reshape([*ids.shape, self.in_dim])


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
