"""bfloat16 on the NumPy side: rounding to nearest-even and exact widening."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from max_gpt2.inference.devices import parse_dtype
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (0.0, 0x0000),
        (1 + 2**-8, 0x3F80),  # a tie: rounds to the even neighbour, 1.0
        (1 + 3 * 2**-8, 0x3F82),  # a tie whose even neighbour is above
        (1 + 2**-8 + 2**-20, 0x3F81),  # just above the tie rounds up
        (np.inf, 0x7F80),
        (-np.inf, 0xFF80),
        (3.4028235e38, 0x7F80),  # float32's largest value rounds past bfloat16's range to inf
    ],
)
def test_known_roundings(value, bits):
    assert float32_to_bfloat16_bits(np.array([value], np.float32))[0] == bits


def test_nan_stays_nan():
    assert np.isnan(bfloat16_bits_to_float32(float32_to_bfloat16_bits(np.array([np.nan], np.float32))))[0]


@given(st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-(2.0**127), max_value=2.0**127))
def test_rounds_to_a_nearest_bfloat16(value):
    x = np.float32(value)
    bits = int(float32_to_bfloat16_bits(np.array([x]))[0])
    rounded = float(bfloat16_bits_to_float32(np.array([bits]))[0])
    neighbours = [float(bfloat16_bits_to_float32(np.array([(bits + step) & 0xFFFF]))[0]) for step in (-1, 1)]
    assert all(abs(rounded - float(x)) <= abs(n - float(x)) for n in neighbours if np.isfinite(n))


def test_widening_is_exact_and_round_trips():
    bits = np.arange(0, 0x7F80, 7, dtype=np.uint16)  # positive finite bfloat16 values
    np.testing.assert_array_equal(float32_to_bfloat16_bits(bfloat16_bits_to_float32(bits)), bits)


def test_parse_dtype():
    assert parse_dtype("bfloat16").name == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16; got 'int8'"):
        parse_dtype("int8")
