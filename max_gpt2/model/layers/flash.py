"""Causal attention that skips the masked half: the `flash` implementation.

Same parameters and result as `GPT2Attention`; only the middle step differs.

`KernelFlashAttention` (GPU) calls MAX's fused flash-attention kernel with its
causal mask variant: scores are computed tile by tile in fast memory and never
stored, and tiles above the diagonal are skipped.

`TiledCausalAttention` (CPU, where MAX has no fused attention kernel) gets the
same saving from graph ops. The sequence is cut into T equal tiles (T fixed
when the graph is built, the tile length symbolic); query tile i is scored
against key tiles 0..i only, never against the later ones the mask would
remove. The softmax spans all of a row's key tiles, so it is assembled from
per-tile row maxima and sums. Of the S x S scores it computes the fraction
(T + 1) / 2T. Its input is `[B, T, S/T, D]`: `CompiledAttention` pads the
sequence with zeros to a multiple of T (padding at the end is in every real
query's future, so it changes nothing) and reshapes.

Shapes, with B = batch, S = sequence length, D = n_embd, H = n_head, d = D / H:

    kernel:  x [B, S, D] -> q, k, v [B, S, H, d] -> flash kernel [B, S, H, d] -> [B, S, D]
    tiled:   x [B, T, S/T, D] -> q, k, v [T, B, H, S/T, d] -> per query tile [B, H, S/T, d]
             -> [B, T, S/T, D]
"""

from __future__ import annotations

import math
import operator
from functools import reduce

from max.experimental import functional as F
from max.experimental.tensor import Tensor
from max.nn.attention import MHAMaskVariant
from max.nn.kernels import flash_attention_gpu

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.layers.attention import GPT2Attention, causal_mask

_flash_attention = F.functional(flash_attention_gpu)


class KernelFlashAttention(GPT2Attention):
    """GPT-2 attention through MAX's GPU flash-attention kernel (no CPU implementation)."""

    def forward(self, x: Tensor) -> Tensor:
        batch, seq_len, _ = x.shape
        # The kernel takes [B, S, H, d], the layout c_attn already produces: no transposes.
        qkv = self.c_attn(x).reshape([batch, seq_len, 3 * self.n_head, self.head_dim])
        query, key, value = F.split(qkv, [self.n_head] * 3, axis=2)
        attended = _flash_attention(
            query, key, value, mask_variant=MHAMaskVariant.CAUSAL_MASK, scale=1 / math.sqrt(self.head_dim)
        )
        return self.c_proj(attended.reshape([batch, seq_len, self.n_embd]))


class TiledCausalAttention(GPT2Attention):
    """GPT-2 attention over `tiles` sequence tiles, skipping the fully masked tile pairs."""

    def __init__(self, config: GPT2Config, tiles: int) -> None:
        super().__init__(config)
        self.tiles = tiles

    def forward(self, x: Tensor) -> Tensor:
        batch, tiles, tile_len, _ = x.shape  # tiles == self.tiles
        qkv = self.c_attn(x).reshape([batch, tiles, tile_len, 3, self.n_head, self.head_dim])
        # Tiles lead, so each tile is one contiguous [B, H, S/T, d] block.
        qkv = qkv.permute([3, 1, 0, 4, 2, 5])  # [3, T, B, H, S/T, d]
        query, key, value = qkv[0] / math.sqrt(self.head_dim), qkv[1], qkv[2]
        # Only a tile with itself needs the mask; earlier key tiles are wholly visible.
        diagonal = causal_mask(tile_len, 0, dtype=x.dtype, device=x.device)  # [S/T, S/T]
        attended = [
            self.attend_tile(
                query[i], [key[j] for j in range(i + 1)], [value[j] for j in range(i + 1)], diagonal
            )
            for i in range(self.tiles)
        ]
        merged = F.stack(attended).permute([1, 0, 3, 2, 4])  # [B, T, S/T, H, d]
        return self.c_proj(merged.reshape([batch, tiles, tile_len, self.n_embd]))

    @staticmethod
    def attend_tile(query: Tensor, keys: list[Tensor], values: list[Tensor], diagonal: Tensor) -> Tensor:
        """One query tile [B, H, t, d] against key and value tiles 0..i [B, H, t, d] -> [B, H, t, d].

        Key tile i is the query tile's own, the only one that needs `diagonal`.
        """
        scores = [query @ key.transpose(-1, -2) for key in keys]  # [B, H, t, t] each
        scores[-1] = scores[-1] + diagonal
        row_max = reduce(F.max, (tile.max(axis=-1) for tile in scores))  # [B, H, t, 1]
        weights = [F.exp(tile - row_max) for tile in scores]
        total = reduce(operator.add, (w.sum(axis=-1) for w in weights))  # [B, H, t, 1]
        attended = reduce(operator.add, (w @ value for w, value in zip(weights, values, strict=True)))
        return attended / total
