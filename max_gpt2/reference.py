"""An independent NumPy reference for GPT-2 attention, in float64.

Written the plain way on purpose, sharing no code with the MAX module: each
head is computed on its own in a Python loop over column slices (no reshape or
transpose into a head axis), the causal rule is a boolean test rather than an
additive mask, and the heads are concatenated at the end. Nothing here imports
MAX, so a mistake in the graph cannot be repeated here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the row maximum for stability."""
    # `initial` keeps an empty sequence (no rows) from failing the reduction.
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True, initial=-np.inf))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def attention(x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int) -> np.ndarray:
    """GPT-2 causal self-attention of `x` `[batch, seq, n_embd]`, computed in float64.

    `weights` holds `c_attn.weight` `[3 * n_embd, n_embd]`, `c_attn.bias`,
    `c_proj.weight` `[n_embd, n_embd]` and `c_proj.bias`, in MAX `Linear`
    layout (what `load_attention_weights` returns). Returns float64
    `[batch, seq, n_embd]`.
    """
    return attention_and_largest_score(x, weights, n_head)[0]


def attention_and_largest_score(
    x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int
) -> tuple[np.ndarray, float]:
    """`attention(x, weights, n_head)`, and the largest |q . k / sqrt(head_dim)| any query may see.

    The largest score measures how sensitive the output is to rounding: a
    score's rounding error grows with its size, and softmax passes it on.
    """
    x = np.asarray(x, dtype=np.float64)
    w_attn, b_attn, w_proj, b_proj = (
        np.asarray(weights[name], dtype=np.float64)
        for name in ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")
    )
    _, seq_len, n_embd = x.shape
    head_dim = n_embd // n_head

    qkv = x @ w_attn.T + b_attn  # [batch, seq, 3 * n_embd]: queries, then keys, then values
    queries, keys, values = qkv[..., :n_embd], qkv[..., n_embd : 2 * n_embd], qkv[..., 2 * n_embd :]
    position = np.arange(seq_len)
    future = position[None, :] > position[:, None]  # [seq, seq]: key after query

    head_outputs, largest_score = [], 0.0
    for head in range(n_head):
        columns = slice(head * head_dim, (head + 1) * head_dim)
        q, k, v = queries[..., columns], keys[..., columns], values[..., columns]
        scores = np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(head_dim)  # [batch, seq, seq]
        largest_score = max(largest_score, float(np.abs(scores[:, ~future]).max(initial=0.0)))
        head_outputs.append(softmax(np.where(future, -np.inf, scores)) @ v)  # [batch, seq, head_dim]

    merged = np.concatenate(head_outputs, axis=-1)  # [batch, seq, n_embd]
    return merged @ w_proj.T + b_proj, largest_score
