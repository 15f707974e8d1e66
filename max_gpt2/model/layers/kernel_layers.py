"""GPT-2's layers through the Mojo decoding kernels (`max_gpt2.kernels`): same parameters, few tokens.

`KernelLinear` is `Linear` through `skinny_matmul`, `SkinnyLinear` the same where a
call has few rows (MAX's matmul past them), `KernelCachedAttention` is
`CachedAttention` through `gpt2_cached_attention`, and `KernelBlock` is a whole
`Block` as one `gpt2_decode_layer` op; the step graph of the language model swaps
them in on the CPU in float32, where a decoding step is bound by memory bandwidth
(`KernelBlock` where the MLP's activation is GELU's tanh form, the kernel's: `block_for`
chooses). The server's decoding graph takes `KernelLinear` (its steps have a token a request,
`SKINNY_ROWS` requests at most) and its graph for prompts `SkinnyLinear`.
"""

from __future__ import annotations

from operator import attrgetter

from max.experimental import functional as F
from max.experimental.nn import Linear
from max.experimental.tensor import Tensor, TensorType

from max_gpt2.kernels import (
    LAYER_NORMS,
    LAYER_PRODUCTS,
    LayerParameters,
    StoredProduct,
    cached_attention,
    decode_layer,
    skinny_matmul,
)
from max_gpt2.model.config import ACTIVATIONS, GPT2Config
from max_gpt2.model.layers.block import Block
from max_gpt2.model.layers.cached_attention import CachedAttention

SKINNY_ROWS = 16
"""Up to this many rows `skinny_matmul` is the faster; past them a product is bound by arithmetic, where
MAX's matmul is the better (docs/performance.md)."""


class KernelLinear(Linear):
    """`Linear` (same parameters) through `skinny_matmul` whatever the rows: for graphs that see few."""

    def forward(self, x: Tensor) -> Tensor:
        """[..., in] -> [..., out]."""
        out_dim, in_dim = self.weight.shape
        y = skinny_matmul(x.reshape([-1, in_dim]), *self._weight_and_bias())  # [M, out], bias added
        return y.reshape([*x.shape[:-1], out_dim])

    def stored(self) -> StoredProduct:
        """The product as `gpt2_decode_layer` takes it: W [out, in], no scales, the bias."""
        weight, bias = self._weight_and_bias()
        return StoredProduct(weight, None, bias)

    def _weight_and_bias(self) -> tuple[Tensor, Tensor | None]:
        """W [out, in] and the bias [out], or None."""
        out_dim, in_dim = self.weight.shape
        bias = self.bias.reshape([out_dim]) if isinstance(self.bias, Tensor) else None
        return self.weight.reshape([out_dim, in_dim]), bias


class SkinnyLinear(KernelLinear):
    """`Linear` (same parameters): `skinny_matmul` up to `SKINNY_ROWS` rows, MAX's matmul past them."""

    def forward(self, x: Tensor) -> Tensor:
        """[..., in] -> [..., out]; the row count may differ from call to call."""
        out_dim, in_dim = self.weight.shape
        rows = x.reshape([-1, in_dim])  # [M, K]
        few = (F.shape_to_tensor([rows.shape[0]]) <= SKINNY_ROWS).reshape([])
        out_type = TensorType(x.dtype, [rows.shape[0], out_dim], device=x.device)
        weight, bias = self._weight_and_bias()  # values outside both branches, which share them
        (y,) = F.cond(
            few,
            [out_type],
            lambda: skinny_matmul(rows, weight, bias),
            lambda: rows @ weight.T if bias is None else rows @ weight.T + bias,
        )
        return y.reshape([*x.shape[:-1], out_dim])


class KernelCachedAttention(CachedAttention):
    """`CachedAttention` (same parameters) through `gpt2_cached_attention`; no attention weights out."""

    def forward(self, x: Tensor, cache: Tensor, key_bias: Tensor) -> Tensor:  # type: ignore[override]
        """`x` [B, S, D], `cache` buffer [2, B, H, M, d], `key_bias` [B, 1, 1, T] -> [B, S, D]."""
        batch, total = key_bias.shape[0], key_bias.shape[-1]
        return self.c_proj(cached_attention(cache, self.c_attn(x), key_bias.reshape([batch, total])))


class KernelBlock(Block):
    """`Block` (same parameters) as one `gpt2_decode_layer` op: for decoding steps, GELU in its tanh form.

    Its attention is a `KernelCachedAttention` and its projections `KernelLinear`s or
    `PackedLinear`s (anything with `stored()`); the op reads their parameters as they are.
    """

    @staticmethod
    def fits(config: GPT2Config) -> bool:
        """Whether the op computes `config`'s activation: GPT-2's own, GELU's tanh form."""
        return ACTIVATIONS[config.activation_function] == "gelu_tanh"

    def forward(self, x: Tensor, cache: Tensor, key_bias: Tensor) -> Tensor:  # type: ignore[override]
        """`x` [B, S, D], `cache` buffer [2, B, H, M, d], `key_bias` [B, 1, 1, T] -> [B, S, D]."""
        batch, total = key_bias.shape[0], key_bias.shape[-1]
        bias = key_bias.reshape([batch, total])
        return decode_layer(x, cache, bias, self.layer_parameters())

    def layer_parameters(self) -> LayerParameters:
        """The block as the decode-layer ops take it: its layer norms and products as stored, in the
        order of `LAYER_NORMS` and `LAYER_PRODUCTS`."""
        norms = tuple(attrgetter(name)(self) for name in LAYER_NORMS)
        products = tuple(attrgetter(name)(self).stored() for name in LAYER_PRODUCTS)
        return LayerParameters(norms, self.ln_1.eps, products)


def block_for(
    config: GPT2Config, kernels: bool, kernel_block: type[KernelBlock] = KernelBlock
) -> type[Block]:
    """The block a graph builds its layers of: `kernel_block` (one decode-layer op a block) where the
    graph runs the kernels and the op computes `config`'s activation (`KernelBlock.fits`), else `Block`."""
    return kernel_block if kernels and kernel_block.fits(config) else Block
