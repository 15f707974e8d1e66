"""GPT-2's layers through the Mojo decoding kernels (`max_gpt2.kernels`): same parameters, few tokens.

`SkinnyLinear` is `Linear` through `skinny_matmul` where a call has few rows, and
`KernelCachedAttention` is `CachedAttention` through `gpt2_cached_attention`; the
step graph of the language model swaps them in on the CPU in float32, where a
decoding step is bound by memory bandwidth, and the server's graph takes
`SkinnyLinear` for its batches of decoding steps and prompts.
"""

from __future__ import annotations

from max.experimental import functional as F
from max.experimental.nn import Linear
from max.experimental.tensor import Tensor, TensorType

from max_gpt2.kernels import cached_attention, skinny_matmul
from max_gpt2.model.cached_attention import CachedAttention

SKINNY_ROWS = 16
"""Up to this many rows `skinny_matmul` is the faster. The 49 products of a GPT-2 small decoding
step alone on a 2-core AVX2 EPYC, MAX's matmul time over `skinny_matmul`'s: 1.58 at 1 row, 1.43 at
8, 1.20 at 16, 0.90 at 32 (many rows are bound by arithmetic, where MAX's matmul is the better)."""


class SkinnyLinear(Linear):
    """`Linear` (same parameters): `skinny_matmul` up to `SKINNY_ROWS` rows, MAX's matmul past them."""

    def forward(self, x: Tensor) -> Tensor:
        """[..., in] -> [..., out]; the row count may differ from call to call."""
        out_dim, in_dim = self.weight.shape
        rows = x.reshape([-1, in_dim])  # [M, K]
        # Values outside both branches, which share them; the kernel adds the bias as it writes y.
        weight = self.weight.reshape([out_dim, in_dim])
        bias = self.bias.reshape([out_dim]) if isinstance(self.bias, Tensor) else None
        few = (F.shape_to_tensor([rows.shape[0]]) <= SKINNY_ROWS).reshape([])
        out_type = TensorType(x.dtype, [rows.shape[0], out_dim], device=x.device)
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
