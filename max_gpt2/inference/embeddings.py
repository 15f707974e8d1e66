"""Embeddings: one vector a text, pooled from the final layer norm's output (`lm.hidden_states`).

    vectors = embed(lm, input_ids, attention_mask)              # float32 [batch, n_embd], unit length
    vectors = embed(lm, input_ids, pooling=Pooling.MEAN, norm=-1)  # the mean, as it is

GPT-2 was trained to predict tokens, not to embed texts; a causal LM's embeddings are what vLLM
(`--runner pooling`, which pools a causal LM's last token and normalises it) and llama-server
(`--embeddings --pooling mean|last`) make of its hidden states, and the same are made here. Prompts
are left-padded (`lm.hidden_states`), so every row's last position is its last token.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from max_gpt2.inference.prompts import check_left_padding, check_prompt

if TYPE_CHECKING:
    from max_gpt2.inference.lm import CompiledLM

INT16_RANGE = 32760.0  # llama.cpp's `embd_normalize` 0 scales the largest value to this


class Pooling(Enum):
    """How a text's hidden states `[seq, n_embd]` become one vector."""

    LAST = "last"  # the last token's: the only one that has attended to every token (vLLM's default)
    MEAN = "mean"  # the mean over the text's tokens, padding left out

    def pool(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """`hidden` float32 `[batch, seq, n_embd]` (left-padded), `mask` `[batch, seq]` (1: a token) ->
        float32 `[batch, n_embd]`."""
        if self is Pooling.LAST:
            return hidden[:, -1]
        weights = mask[..., None].astype(np.float64)
        return ((hidden * weights).sum(axis=1) / weights.sum(axis=1)).astype(np.float32)


def normalized(vectors: np.ndarray, norm: int = 2) -> np.ndarray:
    """Each row of `vectors` `[batch, n_embd]` divided by its norm, as llama.cpp's `embd_normalize` says:
    -1 none, 0 the largest absolute value scaled to `INT16_RANGE`, 1 the sum of absolute values (taxicab),
    2 Euclidean (vLLM's and OpenAI's unit vectors), p > 2 the p-norm. A row of zeros stays zeros."""
    if norm < -1 or norm != int(norm):
        raise ValueError(f"norm: -1 (none), 0 (largest absolute value), or a p-norm's p >= 1; got {norm}")
    if norm == -1:
        return vectors
    rows = np.abs(vectors.astype(np.float64))
    if norm == 0:
        size = rows.max(axis=-1, keepdims=True) / INT16_RANGE
    else:
        size = (rows**norm).sum(axis=-1, keepdims=True) ** (1 / norm)
    scale = np.divide(1.0, size, out=np.zeros_like(size), where=size > 0)
    return (vectors * scale).astype(np.float32)


def embed(
    lm: CompiledLM,
    input_ids: Any,
    attention_mask: Any = None,
    pooling: Pooling = Pooling.LAST,
    norm: int = 2,
) -> np.ndarray:
    """Each text's embedding, float32 `[batch, n_embd]`: its hidden states pooled (`pooling`) and
    normalised (`normalized`'s `norm`; 2, unit length, by default). `input_ids` `[batch, seq]`,
    left-padded where `attention_mask` marks padding with 0."""
    ids, mask = check_prompt(lm.config, input_ids, attention_mask)
    check_left_padding(mask)
    return normalized(pooling.pool(lm.hidden_states(ids, mask), mask), norm)
