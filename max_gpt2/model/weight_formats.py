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

q8_0 and q4_0 are llama.cpp's values and rounding rules (`quantize_q8_0`,
`quantize_q4_0`, row by row, K padded with zeros to whole blocks). Every format
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
one row). `pack` turns the float32 parameters (`Checkpoint.model_weights()`) into
these; `unpack` gives back exactly the float32 weights they stand for.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.weight_adapters import CONV1D_WEIGHTS

FORMATS = ("float32", "bfloat16", "q8_0", "q4_0")
BLOCK = 32  # weights sharing a scale
GROUP = 8  # rows stored interleaved
CHUNK = 32  # consecutive bfloat16 values of a row stored together (a 64-byte cache line)
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


def _blocks(weight: np.ndarray) -> np.ndarray:
    """[N, K] -> [N, Kp / 32, 32] float64, zero-padded to whole blocks."""
    rows, columns = weight.shape
    padded = np.zeros((rows, -(-columns // BLOCK) * BLOCK))
    padded[:, :columns] = weight
    return padded.reshape(rows, -1, BLOCK)


def quantize_q8_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N, K] -> int8 values [N, Kp] and float16 scales [N, Kp / 32], row by row."""
    blocks = _blocks(weight)
    scales = (np.abs(blocks).max(axis=-1) / 127).astype(np.float16)
    inverse = np.divide(1.0, scales.astype(np.float64), out=np.zeros(scales.shape), where=scales != 0)
    values = np.clip(np.rint(blocks * inverse[..., None]), -127, 127).astype(np.int8)
    return values.reshape(weight.shape[0], -1), scales


def quantize_q4_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N, K] -> values 0..15 as uint8 [N, Kp] and float16 scales [N, Kp / 32], row by row."""
    blocks = _blocks(weight)
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    scales = (largest / -8).astype(np.float16)
    inverse = np.divide(1.0, scales.astype(np.float64), out=np.zeros(scales.shape), where=scales != 0)
    values = np.minimum(15, np.trunc(blocks * inverse[..., None] + 8.5)).astype(np.uint8)
    return values.reshape(weight.shape[0], -1), scales


def dequantize(values: np.ndarray, scales: np.ndarray, format: str, columns: int) -> np.ndarray:
    """Row-layout q8_0 or q4_0 values [N, Kp] and scales [N, Kp / 32] -> float32 weights [N, columns]."""
    blocks = values.reshape(values.shape[0], -1, BLOCK).astype(np.float32) - (8 if format == "q4_0" else 0)
    return (blocks * scales.astype(np.float32)[..., None]).reshape(values.shape[0], -1)[:, :columns]


def interleave(values: np.ndarray, scales: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray]:
    """Row-layout values [N, Kp] and scales [N, Kb] -> the kernel's layout (module docstring)."""
    rows, padded = values.shape
    groups, blocks = -(-rows // GROUP), padded // BLOCK
    grouped = np.zeros((groups * GROUP, padded), values.dtype)
    grouped[:rows] = values
    grouped_scales = np.zeros((groups * GROUP, blocks), np.float16)
    grouped_scales[:rows] = scales
    if format == "q8_0":  # [g, r, b, c, e] -> [g, b, c, r, e]
        stored = grouped.reshape(groups, GROUP, blocks, 8, 4).transpose(0, 2, 3, 1, 4)
    else:  # an element's half of its block picks the nibble: [g, r, b, half, c, e] -> [g, b, c, r, e]
        halves = grouped.reshape(groups, GROUP, blocks, 2, 4, 4)
        stored = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).transpose(0, 2, 3, 1, 4)
    stored_scales = grouped_scales.reshape(groups, GROUP, blocks).transpose(0, 2, 1)
    return np.ascontiguousarray(stored.reshape(groups, -1)), np.ascontiguousarray(
        stored_scales.reshape(groups, -1)
    )


def interleave_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns [N, K] -> the kernel's layout, uint16 [N8 / 8, Kp * 8] (module docstring)."""
    rows, columns = bits.shape
    groups, chunks = -(-rows // GROUP), -(-columns // CHUNK)
    padded = np.zeros((groups * GROUP, chunks * CHUNK), np.uint16)
    padded[:rows, :columns] = bits
    stored = padded.reshape(groups, GROUP, chunks, CHUNK).transpose(0, 2, 1, 3)  # [g, c, r, e]
    return np.ascontiguousarray(stored.reshape(groups, -1))


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


def pack(weights: Mapping[str, np.ndarray], format: str) -> dict[str, np.ndarray]:
    """float32 parameters (MAX layout) -> the same with each projection and the LM head in `format`.

    bfloat16 weights come back as their interleaved uint16 bit patterns; q8_0 and q4_0 as
    their interleaved values under the weight's name and their scales under `scales_name`. Arrays
    shared under several names (a tied head) are converted once per name they are
    packed under.
    """
    check_format(format)
    packed: dict[str, np.ndarray] = {}
    for name, array in weights.items():
        if format == "float32" or not is_packed(name):
            packed[name] = array
        elif format == "bfloat16":
            packed[name] = interleave_bfloat16(float32_to_bfloat16_bits(array))
        else:
            quantize = quantize_q8_0 if format == "q8_0" else quantize_q4_0
            packed[name], packed[scales_name(name)] = interleave(*quantize(array), format)
    return packed


def unpack(
    packed: Mapping[str, np.ndarray], format: str, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The float32 weights the packed ones stand for (what the model computes with), by parameter name."""
    weights = {}
    for name, shape in shapes.items():
        if format == "float32" or not is_packed(name):
            weights[name] = packed[name]
        elif format == "bfloat16":
            weights[name] = bfloat16_bits_to_float32(deinterleave_bfloat16(packed[name], *shape))
        else:
            values, scales = deinterleave(packed[name], packed[scales_name(name)], format, shape[0])
            weights[name] = dequantize(values, scales, format, shape[1])
    return weights
