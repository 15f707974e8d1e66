"""GPT-2's multi-head causal self-attention as a MAX `Module`.

Shapes, with B = batch, S = sequence length, D = n_embd, H = n_head, d = D / H:

    x                      [B, S, D]
    c_attn(x)              [B, S, 3D]     one fused projection for Q, K and V
    split                  3 x [B, S, D]
    split heads            3 x [B, H, S, d]   reshape to [B, S, H, d], swap S and H
    q @ k^T / sqrt(d)      [B, H, S, S]   plus the causal mask [S, S], broadcast
    softmax(...) @ v       [B, H, S, d]
    merge heads            [B, S, D]      swap back, reshape
    c_proj                 [B, S, D]

Parameter names (`c_attn.weight`, `c_attn.bias`, `c_proj.weight`, `c_proj.bias`)
match Hugging Face's GPT-2; the weights are stored as MAX `Linear` keeps them,
`[out_features, in_features]`, which is the transpose of GPT-2's Conv1D layout.

With `output_attentions=True` (Hugging Face's name for it) the module also returns
`softmax(...)`, the weights every head gave every key, `[B, H, S, S]`. That is a
separate graph: the plain one never outputs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from max.driver import Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Linear, Module
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, DimLike

from max_gpt2.model.config import GPT2Config


def causal_mask(seq_len: DimLike, past_len: DimLike, dtype: DType, device: Device | DeviceRef) -> Tensor:
    """The additive causal mask, `[seq_len, past_len + seq_len]`.

    Row i is the query at absolute position `past_len + i`; it may look at every
    key up to and including itself. Allowed entries are 0, the rest -inf, so the
    mask is added to the scores before softmax. `past_len` counts keys already
    seen (a KV cache); both lengths may be symbolic dimensions.
    """
    # Within the new tokens the mask is lower-triangular: band_part zeroes the
    # diagonal and everything below it, leaving -inf above. (Comparing two
    # aranges with F.where would read more directly, but MAX 26.7 drops such a
    # mask when it fuses the addition into the softmax that follows.)
    new = F.band_part(
        F.full([seq_len, seq_len], float("-inf"), dtype=dtype, device=device),
        num_lower=None,
        num_upper=0,
        exclude=True,
    )
    if isinstance(past_len, int) and past_len == 0:
        return new
    # Every cached key is in the past of every new query.
    seen = F.full([seq_len, past_len], 0.0, dtype=dtype, device=device)
    return F.concat([seen, new], axis=1)


class GPT2Attention(Module[[Tensor], Tensor | tuple[Tensor, Tensor]]):
    """Multi-head causal self-attention with Hugging Face GPT-2's parameter names."""

    def __init__(
        self, config: GPT2Config, output_attentions: bool = False, linear: Callable[..., Module] = Linear
    ) -> None:
        """`linear` makes the projections: `Linear`, or a module with its parameters and call."""
        self.output_attentions = output_attentions
        self.n_embd = config.n_embd
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.c_attn = linear(config.n_embd, 3 * config.n_embd, bias=True)
        self.c_proj = linear(config.n_embd, config.n_embd, bias=True)

    def split_heads(self, x: Tensor) -> Tensor:
        """[B, S, D] -> [B, H, S, d]."""
        batch, seq_len, _ = x.shape
        return x.reshape([batch, seq_len, self.n_head, self.head_dim]).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """[B, H, S, d] -> [B, S, D]."""
        batch, _, seq_len, _ = x.shape
        return x.transpose(1, 2).reshape([batch, seq_len, self.n_embd])

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """`x` [B, S, D] -> [B, S, D], and the attention weights [B, H, S, S] if `output_attentions`."""
        seq_len = x.shape[1]
        query, key, value = F.split(self.c_attn(x), [self.n_embd] * 3, axis=-1)
        query, key, value = (self.split_heads(t) for t in (query, key, value))
        scores = query @ key.transpose(-1, -2) / math.sqrt(self.head_dim)  # [B, H, S, S]
        weights = F.softmax(scores + causal_mask(seq_len, 0, dtype=x.dtype, device=x.device))
        output = self.c_proj(self.merge_heads(weights @ value))  # [B, S, D]
        return (output, weights) if self.output_attentions else output
