"""Edits of one row of next-token logits before a token is picked: penalties for repeats, and bans.

    row = penalize(row, seen, generated, repetition=1.3, frequency=0.5, presence=0.2)   # [vocab]
    row = ban(row, eos_ids)                                                            # [vocab]

`repetition` is Hugging Face's `repetition_penalty` (`RepetitionPenaltyLogitsProcessor`):
each token id in `seen` (the prompt and the tokens generated so far) has its logit
divided by the penalty where positive and multiplied by it where negative, once
however often it occurs. `frequency` and `presence` are OpenAI's penalties over the
generated tokens only: a token's logit loses `frequency` for each time it was
generated and `presence` once if it was. Repetition goes first, then the other
two, as MAX's sampler orders them. `ban` gives ids the lowest float32 logit, so
no sampler or argmax picks them (Hugging Face's `min_new_tokens` bans end-of-text
this way, with -inf).
"""

from __future__ import annotations

import numpy as np

LOWEST = np.finfo(np.float32).min


def penalize(
    row: np.ndarray,
    seen: np.ndarray,
    generated: np.ndarray,
    repetition: float = 1.0,
    frequency: float = 0.0,
    presence: float = 0.0,
) -> np.ndarray:
    """`row` (float32 [vocab]) with the penalties applied, as a new array; `seen` and `generated` are
    token ids (int [n], repeats allowed), `generated` a part of `seen`."""
    row = np.array(row, dtype=np.float32)
    if repetition != 1.0:
        ids = np.unique(seen)
        values = row[ids]
        row[ids] = np.where(values < 0, values * repetition, values / repetition)
    if frequency or presence:
        ids, counts = np.unique(generated, return_counts=True)
        row[ids] -= (counts * frequency + presence).astype(np.float32)
    return row


def ban(row: np.ndarray, ids: np.ndarray | list[int]) -> np.ndarray:
    """`row` (float32 [vocab]) with `ids` set to the lowest float32, as a new array; ids outside the
    row (an end-of-text id past a small vocabulary) are no token of it and are skipped."""
    row = np.array(row, dtype=np.float32)
    ids = np.asarray(list(ids), dtype=np.int64)
    row[ids[(ids >= 0) & (ids < row.size)]] = LOWEST
    return row
