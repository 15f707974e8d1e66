"""llama.cpp's q8_0 and q4_0 block quantization, bit for bit, and GGUF's blocks (`blocks` uses these).

Blocks of `BLOCK` = 32 weights along a row share a float16 scale d:

    q8_0  int8 values, d = max |w| / 127, q = round(w / d), w = q * d           34 bytes a block
    q4_0  values 0..15, d = (the weight of largest magnitude) / -8, w = (q - 8) * d   18 bytes

`quantize_q8_0` and `quantize_q4_0` are llama.cpp's `quantize_row_q8_0_ref` and
`quantize_row_q4_0_ref`: float32 arithmetic, values rounded with the unrounded d, d stored
rounded to float16; row by row, K padded with zeros to whole blocks. GGUF stores them as rows of
blocks, each its float16 d then its values. A `BlockCode` holds what differs between the two
(`Q8_0_CODE`, `Q4_0_CODE`): `quantize`, `dequantize`, `to_blocks`, `from_blocks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

BLOCK = 32  # weights sharing a scale
QUANTIZED_ROWS = 4096  # rows quantized at a time, so the float32 temporaries stay small


def _quantize_rows(
    weight: np.ndarray, quantize_block: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], dtype: type
) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] -> values [N, Kp] of `dtype` and float16 scales [N, Kp / 32], `QUANTIZED_ROWS` rows at a
    time, each row zero-padded to whole blocks; `quantize_block` takes float32 [n, Kb, 32]."""
    rows, columns = weight.shape
    blocks = -(-columns // BLOCK)
    values, scales = np.empty((rows, blocks * BLOCK), dtype), np.empty((rows, blocks), np.float16)
    for first in range(0, rows, QUANTIZED_ROWS):
        part = slice(first, first + QUANTIZED_ROWS)
        chunk = np.zeros((len(range(rows)[part]), blocks * BLOCK), np.float32)
        chunk[:, :columns] = weight[part]
        chunk_values, scales[part] = quantize_block(chunk.reshape(len(chunk), blocks, BLOCK))
        values[part] = chunk_values.reshape(len(chunk), -1)
    return values, scales


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's `roundf`: to the nearest integer, halves away from zero (exact: no rounding in between)."""
    magnitude = np.abs(x)
    whole = np.floor(magnitude)
    return np.copysign(whole + np.floor(2 * (magnitude - whole)), x)


def _q8_0_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_row_q8_0_ref` on float32 [n, Kb, 32], in its float32 arithmetic."""
    d = np.abs(blocks).max(axis=-1) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    return _roundf(blocks * inverse[..., None]).astype(np.int8), d.astype(np.float16)


def largest_magnitude(values: np.ndarray) -> np.ndarray:
    """[..., n] -> [...]: the first value of largest magnitude along the last axis, its sign kept (the one
    llama.cpp's `amax < fabsf(v)` loops keep)."""
    return np.take_along_axis(values, np.abs(values).argmax(axis=-1)[..., None], axis=-1)[..., 0]


def _q4_0_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_row_q4_0_ref` on float32 [n, Kb, 32]: the first weight of largest magnitude is -8 steps."""
    largest = largest_magnitude(blocks)
    d = largest / np.float32(-8)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    values = np.minimum(15, np.trunc(blocks * inverse[..., None] + np.float32(8.5)))
    return values.astype(np.uint8), d.astype(np.float16)


def quantize_q8_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N, K] -> int8 values [N, Kp] and float16 scales [N, Kp / 32], row by row."""
    return _quantize_rows(weight, _q8_0_blocks, np.int8)


def quantize_q4_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N, K] -> values 0..15 as uint8 [N, Kp] and float16 scales [N, Kp / 32], row by row."""
    return _quantize_rows(weight, _q4_0_blocks, np.uint8)


@dataclass(frozen=True)
class BlockCode:
    """How a block of 32 weights is coded: its values' dtype, whether two values share a byte (the low
    nibble of byte j holds value j, the high one value j + 16), the offset subtracted before scaling,
    and llama.cpp's quantizer for it."""

    dtype: type
    nibbles: bool
    offset: int
    quantize: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # float32 [N, K] -> (values, scales)

    @property
    def block_bytes(self) -> int:
        """A block in GGUF: its float16 scale, then its values."""
        return 2 + (BLOCK // 2 if self.nibbles else BLOCK)

    def dequantize(self, values: np.ndarray, scales: np.ndarray, columns: int) -> np.ndarray:
        """Row-layout values [N, Kp] and scales [N, Kp / 32] -> float32 weights [N, columns] (exact: a value
        times a float16 scale fits in float32)."""
        blocks = values.reshape(values.shape[0], -1, BLOCK).astype(np.float32) - self.offset
        return (blocks * scales.astype(np.float32)[..., None]).reshape(values.shape[0], -1)[:, :columns]

    def to_blocks(self, values: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """Row-layout values [N, Kp] and scales [N, Kb] -> GGUF's blocks, uint8 [N, Kb * block_bytes]."""
        rows, blocks = scales.shape
        grouped = values.reshape(rows, blocks, BLOCK)
        if self.nibbles:
            grouped = grouped[..., : BLOCK // 2] | (grouped[..., BLOCK // 2 :] << 4)
        data = np.empty((rows, blocks, self.block_bytes), np.uint8)
        data[..., :2] = scales.reshape(rows, blocks, 1).view(np.uint8)
        data[..., 2:] = grouped.view(np.uint8)
        return data.reshape(rows, -1)

    def from_blocks(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of `to_blocks`: row-layout values [N, Kp] and scales [N, Kb]."""
        rows = data.shape[0]
        blocks = data.reshape(rows, -1, self.block_bytes)
        scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
        if not self.nibbles:
            return np.ascontiguousarray(blocks[..., 2:]).view(self.dtype).reshape(rows, -1), scales
        packed = blocks[..., 2:]
        return np.concatenate([packed & 0xF, packed >> 4], axis=-1).reshape(rows, -1), scales


Q8_0_CODE = BlockCode(np.int8, nibbles=False, offset=0, quantize=quantize_q8_0)
Q4_0_CODE = BlockCode(np.uint8, nibbles=True, offset=8, quantize=quantize_q4_0)
