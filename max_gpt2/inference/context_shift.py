"""Going on past `n_positions`: the opt-in context shift of `generate(..., context_overflow="shift")`.

When the cache is full and tokens remain to generate, each row keeps the last
half of its tokens (prompt and generated, padding dropped), and they run as a new
left-padded prompt into a new cache, as llama.cpp's context shift discards the
older half of its context. It is an approximation: the kept tokens are computed
again at positions from 0, and the model no longer sees what came before them.
"""

from __future__ import annotations

import numpy as np


def kept_tail(
    ids: np.ndarray, mask: np.ndarray, generated: np.ndarray, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """The new prompt after a shift: each row's last `keep` real tokens of `ids` [B, S] (`mask` marks
    them) followed by `generated` [B, N], left-padded with 0; ids and mask int64 [B, <= keep]."""
    rows = [
        np.concatenate([row[real == 1], new])[-keep:]
        for row, real, new in zip(ids, mask, generated, strict=True)
    ]
    width = max(len(row) for row in rows)
    tail = np.zeros((len(rows), width), dtype=np.int64)
    tail_mask = np.zeros_like(tail)
    for index, row in enumerate(rows):
        tail[index, width - len(row) :] = row
        tail_mask[index, width - len(row) :] = 1
    return tail, tail_mask
