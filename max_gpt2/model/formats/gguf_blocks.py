"""llama.cpp's other block types taken apart into their fields (`blocks` uses these).

A row of weights is stored as blocks; each `*_fields` takes blocks as bytes, uint8 `[n, block bytes]`,
and returns their fields, whose `values()` are the float32 weights `[n, weights a block]` in
llama.cpp's own float32 arithmetic (`dequantize_row_*`), so exact to the bit. Scales are float16.

    Q4_1   32 weights, 20 bytes: d, m, 16 bytes of 4-bit q         w = d * q + m
    Q5_0   32 weights, 22 bytes: d, 4 bytes of 5th bits, 16 of q    w = d * (q - 16)
    Q5_1   32 weights, 24 bytes: d, m, 4 bytes of 5th bits, 16 of q w = d * q + m
    Q4_K   256 weights, 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of
           32, 128 of 4-bit q                                       w = (d * scale) * q - dmin * min
    Q5_K   256 weights, 176 bytes: as Q4_K, with 32 bytes of 5th bits before the 4-bit q
    Q6_K   256 weights, 210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales (one
           per 16 weights), d                                       w = (d * scale) * (q - 32)

In a 32-weight block, byte j of q holds weight j in its low nibble and weight j + 16 in its high
one; the 5th bit of weight j is bit j of the little-endian 32-bit word. In Q4_K and Q5_K, the 128
bytes of q are four runs of 32: run r holds sub-block 2r in its low nibbles and 2r + 1 in its high
ones, and the 5th bit of sub-block s's weight l is bit s of byte l of the 32. In Q6_K, each half of
128 weights takes 64 bytes of low bits and 32 of high ones: its four quarters of 32 are the low
and high nibbles of the first and second 32 bytes, with bits 0-1, 2-3, 4-5, 6-7 of the high bytes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SUPER = 256  # weights in a K-quant super-block


def _float16(data: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, [n]."""
    return np.ascontiguousarray(data[:, at : at + 2]).view(np.float16)[:, 0]


def _nibbles(data: np.ndarray) -> np.ndarray:
    """Bytes [..., k] -> [..., 2k]: every low nibble, then every high one."""
    return np.concatenate([data & 0xF, data >> 4], axis=-1)


def _fifth_bits(data: np.ndarray) -> np.ndarray:
    """4 bytes a block, a little-endian word -> [n, 32]: bit j of the word, as 0 or 16."""
    return np.unpackbits(data, axis=-1, bitorder="little") << 4


class BlockFields(NamedTuple):
    """Q4_1, Q5_0 or Q5_1 blocks [n] taken apart: d float16 [n], the min m float16 [n] (None for Q5_0,
    whose values are offset by 16 instead), q uint8 [n, 32] (0..15 or 0..31, weight j at j)."""

    d: np.ndarray
    m: np.ndarray | None
    q: np.ndarray

    def values(self) -> np.ndarray:
        """The float32 weights [n, 32]: d * q + m, or d * (q - 16), in llama.cpp's float32 order."""
        d, q = self.d.astype(np.float32)[:, None], self.q.astype(np.float32)
        if self.m is None:
            return d * (q - 16)
        return d * q + self.m.astype(np.float32)[:, None]


def q4_1_fields(blocks: np.ndarray) -> BlockFields:
    return BlockFields(_float16(blocks, 0), _float16(blocks, 2), _nibbles(blocks[:, 4:20]))


def q5_0_fields(blocks: np.ndarray) -> BlockFields:
    return BlockFields(_float16(blocks, 0), None, _nibbles(blocks[:, 6:22]) | _fifth_bits(blocks[:, 2:6]))


def q5_1_fields(blocks: np.ndarray) -> BlockFields:
    return BlockFields(
        _float16(blocks, 0), _float16(blocks, 2), _nibbles(blocks[:, 8:24]) | _fifth_bits(blocks[:, 4:8])
    )


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of a Q4_K or Q5_K block -> its 8 sub-blocks' 6-bit scales and mins, uint8 [n, 8].

    Sub-blocks 0-3 take the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take
    the low and high nibbles of bytes 8-11 as their low 4 bits, and the top 2 bits of bytes 0-3
    (scales) and 4-7 (mins) as their high 2."""
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([first & 63, (third & 0xF) | ((first >> 6) << 4)], axis=-1)
    mins = np.concatenate([second & 63, (third >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales, mins


class Q4KFields(NamedTuple):
    """Q4_K blocks [n] taken apart: d and dmin float16 [n], the 6-bit scales and mins uint8 [n, 8] (one
    each a sub-block of 32), the 4-bit q uint8 [n, 8, 32] (by sub-block)."""

    d: np.ndarray
    dmin: np.ndarray
    scales: np.ndarray
    mins: np.ndarray
    q: np.ndarray

    def values(self) -> np.ndarray:
        """The float32 weights [n, 256]: (d * scale) * q - dmin * min, in llama.cpp's float32 order."""
        step = self.d.astype(np.float32)[:, None] * self.scales.astype(np.float32)  # [n, 8]
        offset = self.dmin.astype(np.float32)[:, None] * self.mins.astype(np.float32)
        return (step[..., None] * self.q.astype(np.float32) - offset[..., None]).reshape(len(self.q), SUPER)


class Q6KFields(NamedTuple):
    """Q6_K blocks [n] taken apart: d float16 [n], the int8 scales [n, 16] (one a 16 weights), the 6-bit
    q uint8 [n, 256] (0..63, standing for q - 32)."""

    d: np.ndarray
    scales: np.ndarray
    q: np.ndarray

    def values(self) -> np.ndarray:
        """The float32 weights [n, 256]: (d * scale) * (q - 32), in llama.cpp's float32 order."""
        n = len(self.q)
        step = self.d.astype(np.float32)[:, None] * self.scales.astype(np.float32)  # [n, 16]
        q = self.q.astype(np.float32).reshape(n, 16, 16) - 32
        return (step[..., None] * q).reshape(n, SUPER)


def _k_fields(blocks: np.ndarray, q: np.ndarray) -> Q4KFields:
    """Q4_K's (and Q5_K's) fields, given their q [n, 8, 32]."""
    scales, mins = _scales_and_mins(blocks[:, 4:16])
    return Q4KFields(_float16(blocks, 0), _float16(blocks, 2), scales, mins, q)


def _runs(qs: np.ndarray) -> np.ndarray:
    """128 bytes of 4-bit q -> [n, 8, 32]: run r's low nibbles are sub-block 2r, its high ones 2r + 1."""
    runs = qs.reshape(len(qs), 4, 1, 32)
    return np.concatenate([runs & 0xF, runs >> 4], axis=2).reshape(len(qs), 8, 32)


def q4_k_fields(blocks: np.ndarray) -> Q4KFields:
    return _k_fields(blocks, _runs(blocks[:, 16:144]))


def q5_k_fields(blocks: np.ndarray) -> Q4KFields:
    """Q4_K's fields with 5-bit q (0..31)."""
    high = (blocks[:, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1  # [n, 32 (l), 8 (s)]
    return _k_fields(blocks, _runs(blocks[:, 48:176]) | (high.transpose(0, 2, 1) << 4))


def q6_k_fields(blocks: np.ndarray) -> Q6KFields:
    n = len(blocks)
    low = blocks[:, 0:128].reshape(n, 2, 2, 32)  # [n, half, first or second 32 bytes, l]
    low = np.concatenate([low & 0xF, low >> 4], axis=2)  # [n, half, quarter, l]
    shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3  # [n, half, quarter, l]
    scales = blocks[:, 192:208].view(np.int8)  # [n, 16]: one per 16 weights
    return Q6KFields(_float16(blocks, 208), scales, (low | (high << 4)).reshape(n, SUPER))
