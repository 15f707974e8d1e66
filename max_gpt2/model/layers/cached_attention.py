"""GPT-2 attention that reads and extends a KV cache: the attention of the language model.

Each layer owns one cache buffer, `[2, B, H, M, d]` (keys, then values), allocated
once per generation for M = prompt + new tokens and written in place by the
graph; its dtype may be narrower than the compute dtype (a float16 cache for
float32 compute: keys and values are rounded as stored and widened as read). A
call with S new tokens, T = past + S positions in all:

    x                      [B, S, D]
    c_attn, split heads    q, k, v [B, H, S, d]
    store k, v             cache[:, :, :, past:T]        only the new positions are written
    read keys, values      cache[0 or 1, :, :, :T]       [B, H, T, d]
    q @ keys^T / sqrt(d)   [B, H, S, T]   + causal_mask(S, past) + key_bias [B, 1, 1, T]
    softmax(...) @ values  [B, H, S, d]    softmax(...): the weights, output if `output_attentions`
    merge heads, c_proj    [B, S, D]

The same graph serves the prompt (past = 0, S = prompt length) and every decoding
step (S = 1): S, T and M are symbolic, so no length triggers a compile. `key_bias`
is 0 for real tokens and a large negative number for padding, so a left-padded
row never attends to its padding.
"""

from __future__ import annotations

import math

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor
from max.graph import TensorValue, ops

from max_gpt2.model.layers.attention import GPT2Attention, causal_mask

_shape_to_tensor = F.functional(ops.shape_to_tensor)


def padding_bias(attention_mask: Tensor, dtype: DType) -> Tensor:
    """`attention_mask` `[B, T]` (1 = token, 0 = padding) -> additive key bias `[B, 1, 1, T]`.

    Padding gets the dtype's lowest finite value halved rather than -inf: a
    padding query that may see only padding then still has a finite softmax (its
    output is unused, but a NaN would reach real tokens through 0 * NaN).
    """
    batch, total = attention_mask.shape
    lowest = {DType.float32: -1.7e38, DType.bfloat16: -1.7e38, DType.float16: -32752.0}[dtype]
    bias = (1 - F.cast(attention_mask, dtype)) * lowest
    return bias.reshape([batch, 1, 1, total])


class CachedAttention(GPT2Attention):
    """GPT-2 attention over a KV cache; same parameters as `GPT2Attention`."""

    def forward(  # type: ignore[override]
        self, x: Tensor, cache: Tensor, key_bias: Tensor
    ) -> Tensor | tuple[Tensor, Tensor]:
        """`x` [B, S, D], `cache` buffer [2, B, H, M, d], `key_bias` [B, 1, 1, T] -> [B, S, D].

        With `output_attentions`, also the attention weights [B, H, S, T].
        """
        seq_len, total = x.shape[1], key_bias.shape[-1]
        query, key, value = F.split(self.c_attn(x), [self.n_embd] * 3, axis=-1)
        query, key, value = (self.split_heads(t) for t in (query, key, value))

        # Slice bounds that are only known at run time are host scalars (MAX requires it).
        lengths = _shape_to_tensor([seq_len, total])
        end = TensorValue(lengths[1])
        start = TensorValue(lengths[1] - lengths[0])
        new = F.cast(F.stack([key, value]), cache.dtype)
        F.buffer_store_slice(cache, new, [..., (slice(start, end), "seq"), slice(None)])
        keys, values = (F.cast(cache[part, :, :, (slice(0, end), "total"), :], x.dtype) for part in (0, 1))

        scores = query @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)  # [B, H, S, T]
        mask = F.rebind(causal_mask(seq_len, total - seq_len, x.dtype, x.device), [seq_len, total])
        weights = F.softmax(scores + mask + key_bias)
        output = self.c_proj(self.merge_heads(weights @ values))  # [B, S, D]
        return (output, weights) if self.output_attentions else output
