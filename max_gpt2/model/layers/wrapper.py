"""The per-head "wrapper" formulation the tutorials start from, as a MAX `Module`.

Each of the H heads projects `x` with its own slice of the Q, K and V weights
and runs single-head causal attention; the H outputs are concatenated and go
through `c_proj`. It computes exactly what `GPT2Attention` computes, from the
same parameters, but as 3H narrow matrix multiplies and H small attentions
instead of one wide projection and one batched attention. It exists to be
measured (`python -m max_gpt2 bench`), not to be used.

Shapes, with B = batch, S = sequence length, D = n_embd, H = n_head, d = D / H:

    x                      [B, S, D]
    head h: q, k, v        [B, S, d] each   x @ W[rows of head h]^T + b
    head h: attention      [B, S, d]        scores [B, S, S], causal mask, softmax
    concatenated heads     [B, S, D]
    c_proj                 [B, S, D]
"""

from __future__ import annotations

import math

from max.experimental import functional as F
from max.experimental.tensor import Tensor

from max_gpt2.model.layers.attention import GPT2Attention, causal_mask


class PerHeadWrapperAttention(GPT2Attention):
    """GPT-2 attention computed one head at a time; same parameters as `GPT2Attention`."""

    def head_projection(self, x: Tensor, part: int, head: int) -> Tensor:
        """Head `head`'s query (part 0), key (1) or value (2): [B, S, D] -> [B, S, d]."""
        rows = slice(
            part * self.n_embd + head * self.head_dim, part * self.n_embd + (head + 1) * self.head_dim
        )
        return x @ self.c_attn.weight[rows].T + self.c_attn.bias[rows]

    def forward(self, x: Tensor) -> Tensor:
        seq_len = x.shape[1]
        mask = causal_mask(seq_len, 0, dtype=x.dtype, device=x.device)
        heads = []
        for head in range(self.n_head):
            query, key, value = (self.head_projection(x, part, head) for part in range(3))
            scores = query @ key.transpose(-1, -2) / math.sqrt(self.head_dim)  # [B, S, S]
            heads.append(F.softmax(scores + mask) @ value)
        return self.c_proj(F.concat(heads, axis=-1))
