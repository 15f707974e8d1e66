"""bfloat16 on the NumPy side.

NumPy has no bfloat16, so bfloat16 data crosses the NumPy boundary as its raw
16-bit patterns (`uint16`): a bfloat16 number is the top half of a float32.
"""

from __future__ import annotations

import numpy as np


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Rounds float32 values to bfloat16 (to nearest, ties to even); returns the bits as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit, then truncating, rounds to nearest-even.
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    quiet_nan = np.uint32(0x7FC0)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widens bfloat16 bit patterns (uint16) to float32; exact."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
