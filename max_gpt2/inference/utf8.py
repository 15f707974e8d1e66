"""Which tokens keep a byte-level text valid UTF-8, by where the text's last character stands.

A byte-level BPE token may hold part of a character, and MAX's grammar engine lets through byte
sequences no UTF-8 decoder reads (0xF5 to 0xFF, overlong forms, surrogates, past U+10FFFF): a
JSON string built of them does not parse. `Utf8Tokens` adds that check to a constraint's mask.
A text stands in one of `STATES`: at a character's boundary (0), or inside one, needing 1 to 3
more continuation bytes (0x80-0xBF, or the narrower range the lead byte allows next, as RFC 3629's
table). `following[state, token]` is the state after the token, -1 where it breaks the encoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# (continuation bytes still needed, the range the next one must be in), by state; 0: a boundary.
STATES = ((0, (0, 0)), (1, (0x80, 0xBF)), (2, (0x80, 0xBF)), (3, (0x80, 0xBF)),
          (2, (0xA0, 0xBF)), (2, (0x80, 0x9F)), (3, (0x90, 0xBF)), (3, (0x80, 0x8F)))  # fmt: skip
# The state after a lead byte, by its range (RFC 3629): E0, ED, F0 and F4 narrow the next byte.
LEADS = ((0xC2, 0xDF, 1), (0xE0, 0xE0, 4), (0xE1, 0xEC, 2), (0xED, 0xED, 5), (0xEE, 0xEF, 2),
         (0xF0, 0xF0, 6), (0xF1, 0xF3, 3), (0xF4, 0xF4, 7))  # fmt: skip
AFTER_CONTINUATION = {1: 0, 2: 1, 3: 2, 4: 1, 5: 1, 6: 2, 7: 2}


def after(state: int, data: bytes) -> int:
    """The state after `data` from `state`, or -1 where `data` breaks the encoding."""
    for byte in data:
        if state == 0:
            if byte < 0x80:
                continue
            state = next((to for low, high, to in LEADS if low <= byte <= high), -1)
        else:
            low, high = STATES[state][1]
            state = AFTER_CONTINUATION[state] if low <= byte <= high else -1
        if state < 0:
            return -1
    return state


class Utf8Tokens:
    """`following` (int8 [len(STATES), V]) for a vocabulary of byte strings by id (`neutral`: ids that
    are not text, such as end-of-text, which leave the state as it is)."""

    def __init__(self, vocabulary: Sequence[bytes], neutral: Sequence[int]) -> None:
        following = np.full((len(STATES), len(vocabulary)), -1, dtype=np.int8)
        ascii_ = np.array([data.isascii() for data in vocabulary])
        following[0, ascii_] = 0  # the commonest case, at once: ASCII keeps a boundary a boundary
        for id_ in np.flatnonzero(~ascii_):
            for state in range(len(STATES)):
                following[state, id_] = after(state, vocabulary[id_])
        following[:, list(neutral)] = np.arange(len(STATES), dtype=np.int8)[:, None]
        self.following = following

    def packed(self, words: int) -> np.ndarray:
        """Bitmasks of the tokens valid from each state: int32 [len(STATES), words], bit i of a row set
        where token i keeps the text valid UTF-8."""
        bits = np.zeros((len(STATES), words * 32), dtype=bool)
        bits[:, : self.following.shape[1]] = self.following >= 0
        return np.packbits(bits, axis=1, bitorder="little").view(np.int32)
