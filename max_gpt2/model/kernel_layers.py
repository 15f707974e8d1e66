"""GPT-2's layers through the Mojo decoding kernels (`max_gpt2.kernels`): same parameters, few tokens.

`SkinnyLinear` is `Linear` through `skinny_matmul` and `KernelCachedAttention` is
`CachedAttention` through `gpt2_cached_attention`; the step graph of the language
model swaps them in on the CPU in float32, where a decoding step is bound by
memory bandwidth. They fit a few new tokens; prompts run through MAX's own ops.
"""

from __future__ import annotations

from max.experimental.nn import Linear
from max.experimental.tensor import Tensor

from max_gpt2.kernels import cached_attention, skinny_matmul
from max_gpt2.model.cached_attention import CachedAttention


class SkinnyLinear(Linear):
    """`Linear` (same parameters) through `skinny_matmul`: for inputs of a few rows."""

    def forward(self, x: Tensor) -> Tensor:
        """[..., in] -> [..., out]."""
        out_dim, in_dim = self.weight.shape
        rows = x.reshape([-1, in_dim])  # [M, K]
        y = skinny_matmul(rows, self.weight) + self.bias  # [M, N]; the bias is 0 where there is none
        return y.reshape([*x.shape[:-1], out_dim])


class KernelCachedAttention(CachedAttention):
    """`CachedAttention` (same parameters) through `gpt2_cached_attention`; no attention weights out."""

    def forward(self, x: Tensor, cache: Tensor, key_bias: Tensor) -> Tensor:  # type: ignore[override]
        """`x` [B, S, D], `cache` buffer [2, B, H, M, d], `key_bias` [B, 1, 1, T] -> [B, S, D]."""
        batch, total = key_bias.shape[0], key_bias.shape[-1]
        return self.c_proj(cached_attention(cache, self.c_attn(x), key_bias.reshape([batch, total])))
