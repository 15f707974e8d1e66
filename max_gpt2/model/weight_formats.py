"""How the language model may store its weights for decoding on the CPU: fewer bytes per weight.

A decoding step reads every weight once, so its speed is bytes of weights over
memory bandwidth. Besides float32, the projections and the LM head may be stored
as (activations and sums stay float32):

    bfloat16  the top half of each float32 (round to nearest even), 2 bytes a weight
    q8_0      blocks of 32 weights along a row, int8 values and one float16 scale a block:
              w = q * d, d = max |w| / 127, q = round(w / d); 1.0625 bytes a weight
    q4_0      blocks of 32, 4-bit values 0..15 two a byte (a block's elements 0..15 in the
              low nibbles of its 16 bytes, 16..31 in the high ones) and a float16 scale:
              w = (q - 8) * d, d = (the block's weight of largest magnitude) / -8; 0.5625 bytes

q8_0 and q4_0 are llama.cpp's formats and rounding rules, laid out as two arrays
(the values [N, Kp], the scales [N, Kp / 32]) with K padded to whole blocks of
zeros. The embeddings, biases and layer norms stay float32 (an embedding lookup
reads one row). `pack` turns the float32 parameters (`Checkpoint.model_weights()`)
into these; `unpack` is the exact inverse of what each format kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.weight_adapters import CONV1D_WEIGHTS

FORMATS = ("float32", "bfloat16", "q8_0", "q4_0")
BLOCK = 32
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def check_format(weights: str) -> str:
    """`weights` if it names a format, else a ValueError listing them."""
    if weights not in FORMATS:
        raise ValueError(f"weights must be one of {', '.join(FORMATS)}; got {weights!r}")
    return weights


def is_packed(name: str) -> bool:
    """Whether parameter `name` is stored in the chosen format: the projections and the LM head."""
    return name.endswith(CONV1D_WEIGHTS) or name == "lm_head.weight"


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
    """float32 [N, K] -> int8 values [N, Kp] and float16 scales [N, Kp / 32]."""
    blocks = _blocks(weight)
    scales = (np.abs(blocks).max(axis=-1) / 127).astype(np.float16)
    inverse = np.divide(1.0, scales.astype(np.float64), out=np.zeros(scales.shape), where=scales != 0)
    values = np.clip(np.rint(blocks * inverse[..., None]), -127, 127).astype(np.int8)
    return values.reshape(weight.shape[0], -1), scales


def quantize_q4_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N, K] -> packed uint8 [N, Kp / 2] and float16 scales [N, Kp / 32]."""
    blocks = _blocks(weight)
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    scales = (largest / -8).astype(np.float16)
    inverse = np.divide(1.0, scales.astype(np.float64), out=np.zeros(scales.shape), where=scales != 0)
    values = np.minimum(15, np.trunc(blocks * inverse[..., None] + 8.5)).astype(np.uint8)  # 0..15
    packed = values[..., : BLOCK // 2] | (values[..., BLOCK // 2 :] << 4)  # [N, Kp / 32, 16]
    return packed.reshape(weight.shape[0], -1), scales


def dequantize(values: np.ndarray, scales: np.ndarray, weights: str, columns: int) -> np.ndarray:
    """q8_0 or q4_0 values and scales -> the float32 weights they stand for, [N, columns]."""
    rows = values.shape[0]
    if weights == "q8_0":
        blocks = values.reshape(rows, -1, BLOCK).astype(np.float32)
    else:
        packed = values.reshape(rows, -1, BLOCK // 2)
        blocks = np.concatenate([packed & 0xF, packed >> 4], axis=-1).astype(np.float32) - 8
    return (blocks * scales.astype(np.float32)[..., None]).reshape(rows, -1)[:, :columns]


def pack(weights: Mapping[str, np.ndarray], format: str) -> dict[str, np.ndarray]:
    """float32 parameters (MAX layout) -> the same with each projection and the LM head in `format`.

    bfloat16 weights come back as their uint16 bit patterns; q8_0 and q4_0 as their
    values under the weight's name and their scales under `scales_name`. Arrays
    shared under several names (a tied head) are converted once per name they are
    packed under.
    """
    check_format(format)
    packed: dict[str, np.ndarray] = {}
    for name, array in weights.items():
        if format == "float32" or not is_packed(name):
            packed[name] = array
        elif format == "bfloat16":
            packed[name] = float32_to_bfloat16_bits(array)
        else:
            quantize = quantize_q8_0 if format == "q8_0" else quantize_q4_0
            packed[name], packed[scales_name(name)] = quantize(array)
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
            weights[name] = bfloat16_bits_to_float32(packed[name])
        else:
            weights[name] = dequantize(packed[name], packed[scales_name(name)], format, shape[1])
    return weights
