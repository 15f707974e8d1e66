"""How the language model may store its weights for decoding on the CPU: fewer bytes per weight.

A decoding step reads every weight once, so its speed is bytes of weights over
memory bandwidth. Besides float32, the projections and the LM head may be stored
as (the sums stay float32; as in llama.cpp the kernels round each product's input
to bfloat16 against bfloat16 weights, to int8 blocks against q8_0 and q4_0):

    bfloat16  the top half of each float32 (round to nearest even), 2 bytes a weight
    q8_0      blocks of 32 weights along a row, int8 values and one float16 scale a block:
              w = q * d, d = max |w| / 127, q = round(w / d); 1.0625 bytes a weight
    q4_0      blocks of 32, values 0..15 (4 bits) and a float16 scale: w = (q - 8) * d,
              d = (the block's weight of largest magnitude) / -8; 0.5625 bytes a weight

q8_0 and q4_0 are llama.cpp's values and rounding rules, bit for bit (`quantize_q8_0`,
`quantize_q4_0` are its `quantize_row_q8_0_ref` and `quantize_row_q4_0_ref`: float32
arithmetic, values rounded with the unrounded d, d stored rounded to float16; row by row,
K padded with zeros to whole blocks). GGUF stores them as rows of blocks, each its float16
d then its values (`to_blocks`, `from_blocks`); `interleave_blocks` shuffles those bytes
into the kernels' layout, below. Every format
but float32 is stored for our kernels (`max_gpt2/kernels/`) with 8 rows
interleaved, N padded with zero rows to a multiple of 8: a decoding step then
reads each group of 8 rows as one stream of memory, not 8 (docs/performance.md).
q8_0 and q4_0 (`interleave`) also put 4 consecutive values of each of the 8 rows
in one register:

    bfloat16     uint16 [N8 / 8, Kp * 8]   group g, chunk c, row r, element e (0..31), K padded to
                                           a multiple of 32: at c * 256 + r * 32 + e: W[8g + r, 32c + e]
    q8_0 values  int8 [N8 / 8, Kb * 256]   group g, block b, chunk c, row r, element e:
                                           at (b * 8 + c) * 32 + r * 4 + e: q[8g + r, 32b + 4c + e]
    q4_0 values  uint8 [N8 / 8, Kb * 128]  at (b * 4 + c) * 32 + r * 4 + e: q[8g + r, 32b + 4c + e]
                                           in the low nibble, q[8g + r, 32b + 16 + 4c + e] in the high
    scales       float16 [N8 / 8, Kb * 8]  at b * 8 + r: d[8g + r, b]

The embeddings, biases and layer norms stay float32 (an embedding lookup reads
one row). `max_gpt2.model.stored_weights` puts a model's parameters into these layouts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from max_gpt2.model.weight_adapters import CONV1D_WEIGHTS

FORMATS = ("float32", "bfloat16", "q8_0", "q4_0")
BLOCK = 32  # weights sharing a scale
GROUP = 8  # rows stored interleaved
CHUNK = 32  # consecutive bfloat16 values of a row stored together (a 64-byte cache line)
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}  # a block of 32 weights in GGUF: its float16 scale and values
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
SERVED_FORMAT_VARIABLE = "MAX_GPT2_WEIGHT_FORMAT"  # what `max-gpt2 serve --weight-format` hands MAX's server
RENAMED_SERVED_FORMAT_VARIABLE = "MAX_GPT2_WEIGHTS"  # its deprecated name, still read


def check_format(weight_format: str, source: str = "weight_format") -> str:
    """`weight_format` if it names a format, else a ValueError listing them that names where it came from."""
    if weight_format not in FORMATS:
        raise ValueError(f"{source} must be one of {', '.join(FORMATS)}; got {weight_format!r}")
    return weight_format


def renamed_weights_keyword(where: str, weight_format: str | None, weights: str | None) -> str:
    """The format a caller of `where` asked for: `weight_format`, or `weights`, its deprecated name
    (with a DeprecationWarning), or float32 when neither is given; both at once is a TypeError."""
    if weights is None:
        return "float32" if weight_format is None else weight_format
    if weight_format is not None:
        raise TypeError(f"{where} takes weight_format= or its deprecated name weights=, not both")
    message = f"{where}: weights= is deprecated and will be removed; pass weight_format={weights!r}"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    return weights


def is_packed(name: str) -> bool:
    """Whether parameter `name` is stored in the chosen format: the projections and the LM head."""
    return name.endswith(CONV1D_WEIGHTS) or name == "lm_head.weight"


def is_stored_packed(name: str, format: str) -> bool:
    """Whether `pack` stores parameter `name` in `format`'s own dtypes (a packed weight or its scales)
    rather than as the float32 it was."""
    return format != "float32" and (is_packed(name) or name.endswith(".scales"))


def scales_name(name: str) -> str:
    """Where a packed weight's scales go: `...c_attn.weight` -> `...c_attn.scales`."""
    return name.removesuffix("weight") + "scales"


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


def _q4_0_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_row_q4_0_ref` on float32 [n, Kb, 32]: the first weight of largest magnitude is -8 steps."""
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)[..., 0]
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


def quantize(weight: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_q8_0` or `quantize_q4_0`, as `format` names."""
    return (quantize_q8_0 if format == "q8_0" else quantize_q4_0)(weight)


def dequantize(values: np.ndarray, scales: np.ndarray, format: str, columns: int) -> np.ndarray:
    """Row-layout q8_0 or q4_0 values [N, Kp] and scales [N, Kp / 32] -> float32 weights [N, columns]
    (exact: a value times a float16 scale fits in float32)."""
    blocks = values.reshape(values.shape[0], -1, BLOCK).astype(np.float32) - (8 if format == "q4_0" else 0)
    return (blocks * scales.astype(np.float32)[..., None]).reshape(values.shape[0], -1)[:, :columns]


def to_blocks(values: np.ndarray, scales: np.ndarray, format: str) -> np.ndarray:
    """Row-layout values [N, Kp] and scales [N, Kb] -> GGUF's blocks, uint8 [N, Kb * BLOCK_BYTES]:
    each block its float16 scale, then 32 int8 values (q8_0) or 16 bytes holding value j in the low
    nibble of byte j and value j + 16 in its high nibble (q4_0)."""
    rows, blocks = scales.shape
    grouped = values.reshape(rows, blocks, BLOCK)
    if format == "q4_0":
        grouped = grouped[..., : BLOCK // 2] | (grouped[..., BLOCK // 2 :] << 4)
    data = np.empty((rows, blocks, BLOCK_BYTES[format]), np.uint8)
    data[..., :2] = scales.reshape(rows, blocks, 1).view(np.uint8)
    data[..., 2:] = grouped.view(np.uint8)
    return data.reshape(rows, -1)


def from_blocks(data: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `to_blocks`: row-layout values [N, Kp] and scales [N, Kb]."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, BLOCK_BYTES[format])
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
    if format == "q8_0":
        return np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, -1), scales
    packed = blocks[..., 2:]
    return np.concatenate([packed & 0xF, packed >> 4], axis=-1).reshape(rows, -1), scales


def _grouped(
    source: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, order: tuple[int, ...]
) -> np.ndarray:
    """`source` [N, ...] with its rows in groups of 8, zero rows padding the last: one copy into an
    array of `shape` [G, ...] whose axes `order` puts as [G, r, ...]."""
    stored = np.zeros(shape, dtype)
    view = stored.transpose(order)  # [G, r, ...]
    full = source.shape[0] // GROUP
    view[:full] = source[: full * GROUP].reshape(full, GROUP, *source.shape[1:])
    if full < shape[0]:
        view[full, : source.shape[0] - full * GROUP] = source[full * GROUP :]
    return stored


def interleave_blocks(data: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray]:
    """GGUF's blocks [N, Kb * BLOCK_BYTES] -> the kernel's layout (module docstring): a shuffle of their
    bytes. A q4_0 block's byte j already holds values j and j + 16, as the kernel's does."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, BLOCK_BYTES[format])
    count, groups = blocks.shape[1], -(-rows // GROUP)
    chunks = 8 if format == "q8_0" else 4
    dtype = np.int8 if format == "q8_0" else np.uint8
    values = blocks[..., 2:].view(dtype).reshape(rows, count, chunks, 4)
    stored = _grouped(values, (groups, count, chunks, GROUP, 4), dtype, (0, 3, 1, 2, 4))
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
    stored_scales = _grouped(scales, (groups, count, GROUP), np.float16, (0, 2, 1))
    return stored.reshape(groups, -1), stored_scales.reshape(groups, -1)


def interleave(values: np.ndarray, scales: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray]:
    """Row-layout values [N, Kp] and scales [N, Kb] -> the kernel's layout (module docstring)."""
    return interleave_blocks(to_blocks(values, scales, format), format)


def interleave_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns [N, K] -> the kernel's layout, uint16 [N8 / 8, Kp * 8] (module docstring)."""
    rows, columns = bits.shape
    groups, chunks = -(-rows // GROUP), -(-columns // CHUNK)
    if columns % CHUNK:
        padded = np.zeros((rows, chunks * CHUNK), np.uint16)
        padded[:, :columns] = bits
        bits = padded
    chunked = bits.reshape(rows, chunks, CHUNK)
    stored = _grouped(chunked, (groups, chunks, GROUP, CHUNK), np.uint16, (0, 2, 1, 3))  # [g, c, r, e]
    return stored.reshape(groups, -1)


def deinterleave_bfloat16(stored: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """The inverse of `interleave_bfloat16`: bit patterns [rows, columns]."""
    groups, chunks = stored.shape[0], stored.shape[1] // (GROUP * CHUNK)
    bits = stored.reshape(groups, chunks, GROUP, CHUNK).transpose(0, 2, 1, 3)  # [g, r, c, e]
    return bits.reshape(groups * GROUP, chunks * CHUNK)[:rows, :columns]


def deinterleave(
    stored: np.ndarray, stored_scales: np.ndarray, format: str, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `interleave`: row-layout values [rows, Kp] and scales [rows, Kb]."""
    groups, blocks = stored_scales.shape[0], stored_scales.shape[1] // GROUP
    scales = stored_scales.reshape(groups, blocks, GROUP).transpose(0, 2, 1).reshape(-1, blocks)
    if format == "q8_0":
        values = stored.reshape(groups, blocks, 8, GROUP, 4).transpose(0, 3, 1, 2, 4)
    else:
        nibbles = stored.reshape(groups, blocks, 4, GROUP, 4).transpose(0, 3, 1, 2, 4)  # [g, r, b, c, e]
        values = np.stack([nibbles & 0xF, nibbles >> 4], axis=3)  # [g, r, b, half, c, e]
    return values.reshape(groups * GROUP, -1)[:rows], scales[:rows]
