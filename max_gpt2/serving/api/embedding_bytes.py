"""An embedding's numbers as bytes, in vLLM's `embed_dtype` and `endianness`: what `encoding_format`
"base64" and "bytes" carry.

    raw(vector, "bfloat16", "big")   # [n] float32 -> 2n bytes

Each dtype rounds the float32 vector to nearest, ties to even, as PyTorch's CPU conversions do (vLLM
converts with them; checked against PyTorch 2.13): float16 as NumPy's, bfloat16 the upper half of
the float32 bits after the rounding bias (NaN 0xFFFF), and the 8-bit floats from their traits
(`EightBit`): a number, or an infinity, past the largest finite becomes `overflow` (e4m3fn, which
has no infinity, its largest: PyTorch saturates; e5m2 infinity), the sign kept; NaN 0x7F.
"native" is this machine's byte order; one-byte dtypes have none.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EightBit:
    """An 8-bit float: its exponent and mantissa bits, its largest finite number, and the bits a number
    past it (or an infinity) becomes."""

    exponent_bits: int
    mantissa_bits: int
    largest: float
    overflow: int

    def encode(self, values: np.ndarray) -> np.ndarray:
        """`values` (float32) as this format's bits, rounded to nearest, ties to even."""
        bias, mantissa_bits = 2 ** (self.exponent_bits - 1) - 1, self.mantissa_bits
        x = values.astype(np.float64)  # exact, and room for the scaling below
        size = np.where(np.isfinite(x), np.abs(x), 0.0)
        lowest = 1 - bias  # the smallest normal's exponent; below it, subnormal steps of the same size
        exponent = np.maximum(np.frexp(np.where(size > 0, size, 1.0))[1] - 1, lowest)
        step = np.ldexp(1.0, exponent - mantissa_bits)
        rounded = np.round(size / step) * step  # NumPy rounds halves to even
        after = np.maximum(np.frexp(np.where(rounded > 0, rounded, 1.0))[1] - 1, lowest)
        normal = rounded >= np.ldexp(1.0, lowest)
        field = np.where(normal, after + bias, 0)
        fraction = rounded / np.ldexp(1.0, after - mantissa_bits) - np.where(normal, 2**mantissa_bits, 0)
        bits = (field << mantissa_bits) | fraction.astype(np.int64)
        bits = np.where((rounded > self.largest) | np.isinf(x), self.overflow, bits)
        bits = np.where(np.isnan(x), 0x7F, bits)
        return (bits | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


EIGHT_BIT = {
    "fp8_e4m3": EightBit(exponent_bits=4, mantissa_bits=3, largest=448.0, overflow=0x7E),  # e4m3fn
    "fp8_e5m2": EightBit(exponent_bits=5, mantissa_bits=2, largest=57344.0, overflow=0x7C),
}
EMBED_DTYPES = ("float32", "float16", "bfloat16", *EIGHT_BIT)  # vLLM's


def raw(vector: np.ndarray, embed_dtype: str, endianness: str) -> bytes:
    """`vector`'s numbers in `embed_dtype` (one of `EMBED_DTYPES`), in `endianness` ("native", "big" or
    "little") byte order."""
    values = np.asarray(vector, np.float32)
    if embed_dtype in EIGHT_BIT:
        return EIGHT_BIT[embed_dtype].encode(values).tobytes()
    if embed_dtype == "bfloat16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = ((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16).astype(np.uint16)
        numbers = np.where(np.isnan(values), np.uint16(0xFFFF), rounded)
    else:
        with np.errstate(over="ignore"):  # past float16's largest: infinity, as PyTorch's
            numbers = values.astype(np.float16 if embed_dtype == "float16" else np.float32)
    order = sys.byteorder if endianness == "native" else endianness
    return numbers.astype(numbers.dtype.newbyteorder("<" if order == "little" else ">")).tobytes()
