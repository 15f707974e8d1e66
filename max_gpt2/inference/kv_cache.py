"""The KV cache of `CompiledLM`'s steps: a buffer per layer, written in place, and which positions are tokens.

How the steps use it:

    cache = lm.new_cache(batch, capacity)   # buffers [2, batch, n_head, capacity, head_dim] per layer
    lm.prefill(input_ids, cache)            # writes the prompt's positions; cache.length grows
    lm.decode_step(tokens, cache)           # writes one position per row
    lm.extend(tokens, cache)                # writes S positions per row (drafted tokens checked at once)
    cache.truncate(length)                  # drops the positions past `length` (rejected drafts)
    lm.reorder_cache(cache, rows, kept)     # beam search: row b takes row rows[b]'s positions
"""

from __future__ import annotations

import numpy as np
from max.driver import Buffer


class KVCache:
    """A batch's keys and values in every layer, written in place by the graphs, and what they hold.

    `buffers`: one `[2, batch, n_head, capacity, head_dim]` buffer per layer
    (keys, then values, in the model's `kv_dtype`), uninitialised until written. `attention_mask` `[batch,
    length]` marks which of the positions written so far are tokens (1) and
    which padding (0).
    """

    def __init__(self, buffers: list[Buffer], batch: int, capacity: int) -> None:
        self.buffers, self.batch, self.capacity = buffers, batch, capacity
        self.attention_mask = np.zeros((batch, 0), dtype=np.int64)

    @property
    def length(self) -> int:
        """Positions written so far, padding included."""
        return self.attention_mask.shape[1]

    def truncate(self, length: int) -> None:
        """Forgets every position from `length` on (0 <= length <= `self.length`): nothing is copied, the next
        write goes there."""
        if (
            isinstance(length, bool)
            or not isinstance(length, (int, np.integer))
            or not 0 <= length <= self.length
        ):
            raise ValueError(f"length must be an integer in 0..{self.length}, got {length!r}")
        self.attention_mask = self.attention_mask[:, :length]

    def next_positions(self) -> np.ndarray:
        """The position id of each row's next token, int64 [batch, 1]: the real tokens so far."""
        return self.attention_mask.sum(axis=1, keepdims=True)

    def reorder(self, rows: object, kept: object = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Row b becomes row `rows[b]` (int [batch], each in 0..batch-1): its mask here, at once; returns
        `rows` and `kept` (int [batch] in 0..length, the first positions of each row not to copy; all 0
        where not given) as int64, or None where nothing is left to copy (the buffers are
        `CompiledLM.reorder_cache`'s to move)."""
        order = np.asarray(rows)
        valid = order.shape == (self.batch,) and np.issubdtype(order.dtype, np.integer)
        if not valid or ((order < 0) | (order >= self.batch)).any():
            raise ValueError(f"rows must be {self.batch} row indices in 0..{self.batch - 1}, got {rows!r}")
        same = np.zeros(self.batch, np.int64) if kept is None else np.asarray(kept)
        valid = same.shape == (self.batch,) and np.issubdtype(same.dtype, np.integer)
        if not valid or ((same < 0) | (same > self.length)).any():
            raise ValueError(f"kept must be {self.batch} position counts in 0..{self.length}, got {kept!r}")
        self.attention_mask = self.attention_mask[order]
        if ((order == np.arange(self.batch)) | (same == self.length)).all():
            return None
        return order.astype(np.int64), same.astype(np.int64)
