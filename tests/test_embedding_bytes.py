"""vLLM's `embed_dtype` and `endianness` (`max_gpt2.serving.api.embedding_bytes`) against references
written here: every code of each 8-bit float read back by its formula, and the nearest of them taken
(ties to the even code, a number past the largest finite going to the next code up, as rounding to
nearest would); bfloat16 from the two float32 neighbours that keep 16 bits. Where PyTorch is installed,
the bytes are its conversions' too (vLLM converts with them; PyTorch's e4m3fn saturates)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from max_gpt2.serving.api.embedding_bytes import EIGHT_BIT, raw

# Each 8-bit float: exponent and mantissa bits, what its all-ones exponent means, and the code a number
# rounding past the largest finite becomes (e4m3fn, which has no infinity: its largest, as PyTorch
# saturates; e5m2: infinity).
FORMATS = {"fp8_e4m3": (4, 3, "nan at 0x7f", 0x7E), "fp8_e5m2": (5, 2, "infinity and nans", 0x7C)}


def codes(name: str) -> dict[int, float]:
    """Every finite code of format `name` and its number."""
    exponent_bits, mantissa_bits, top, _ = FORMATS[name]
    bias, values = 2 ** (exponent_bits - 1) - 1, {}
    for code in range(256):
        exponent = (code >> mantissa_bits) & (2**exponent_bits - 1)
        fraction = (code & (2**mantissa_bits - 1)) / 2**mantissa_bits
        if exponent == 2**exponent_bits - 1 and (top != "nan at 0x7f" or code & 0x7F == 0x7F):
            continue
        size = 2.0 ** (1 - bias) * fraction if exponent == 0 else 2.0 ** (exponent - bias) * (1 + fraction)
        values[code] = -size if code & 0x80 else size
    return values


def nearest(name: str, x: float) -> int:
    """The code of format `name` nearest `x`, ties to the even code; past the largest finite, the next
    code up (as far above it as the step below it, its parity deciding its tie), or the largest where
    the format saturates."""
    if math.isnan(x):
        return 0xFF if math.copysign(1, x) < 0 else 0x7F
    values, sign = codes(name), 0x80 if math.copysign(1, x) < 0 else 0
    positive = {code: value for code, value in values.items() if code < 0x80}
    largest = max(positive.values())
    step = largest - sorted(positive.values())[-2]
    beyond, size = FORMATS[name][3], abs(x)
    if beyond in positive:  # it saturates: anything past the largest is the largest
        candidates = positive if size <= largest else {beyond: largest}
    else:
        candidates = {**positive, beyond: largest + step}
    if size > largest + step:
        return beyond | sign
    best = min(candidates, key=lambda code: (abs(size - candidates[code]), code & 1))
    return best | sign


EDGES = [0.0, -0.0, 1e-9, 460.0, 464.0, 470.0, 500.0, 61000.0, 61440.0, 1e6, np.inf, -np.inf, np.nan]


def test_each_eight_bit_format_rounds_to_the_nearest_code_ties_to_even():
    generator = np.random.default_rng(0)
    for name in FORMATS:
        values = sorted(codes(name).values())
        between = [(a + b) / 2 for a, b in itertools.pairwise(values)]  # every tie
        scattered = generator.normal(size=500) * 10.0 ** generator.integers(-4, 4, 500)
        numbers = np.array([*values, *between, *scattered, *EDGES], np.float32)
        found = np.frombuffer(raw(numbers, name, "native"), np.uint8)
        expected = [nearest(name, float(x)) for x in numbers]
        assert found.tolist() == expected, name
        assert EIGHT_BIT[name].largest == max(values)


def test_bfloat16_keeps_the_nearer_of_its_two_float32_neighbours_ties_to_even():
    generator = np.random.default_rng(1)
    numbers = (generator.normal(size=4000) * 10.0 ** generator.integers(-30, 30, 4000)).astype(np.float32)
    ties = ((generator.integers(0, 2**15, 200) << 16) | 0x8000).astype(np.uint32).view(np.float32)
    numbers = np.concatenate([numbers, ties, np.float32([0.0, -0.0, np.inf, -np.inf])])
    found = np.frombuffer(raw(numbers, "bfloat16", "little"), "<u2")
    for x, bits in zip(numbers, found, strict=True):
        below = np.uint32(x.view(np.uint32) & 0xFFFF0000)
        low, high = float(below.view(np.float32)), float(np.uint32(below + 0x10000).view(np.float32))
        gap_low, gap_high = abs(float(x) - low), abs(high - float(x))
        exact = float(x) == low  # infinities too, whose gaps are no numbers
        keep_low = exact or gap_low < gap_high or (gap_low == gap_high and not (below >> 16) & 1)
        assert bits == (below >> 16 if keep_low else (below >> 16) + 1), x
    assert np.frombuffer(raw(np.float32([np.nan]), "bfloat16", "little"), "<u2")[0] == 0xFFFF  # PyTorch's


@pytest.mark.parametrize(("dtype", "numpy_dtype"), [("float32", "f4"), ("float16", "f2"), ("bfloat16", "u2")])
def test_endianness_orders_the_bytes_native_as_this_machine(dtype, numpy_dtype):
    vector = np.random.default_rng(2).normal(size=60).astype(np.float32)
    little, big = raw(vector, dtype, "little"), raw(vector, dtype, "big")
    assert np.array_equal(np.frombuffer(little, "<" + numpy_dtype), np.frombuffer(big, ">" + numpy_dtype))
    assert raw(vector, dtype, "native") == (little if np.little_endian else big) != big
    if dtype != "bfloat16":
        np.testing.assert_array_equal(np.frombuffer(little, "<" + numpy_dtype), vector.astype(numpy_dtype))


def test_the_bytes_are_pytorchs_conversions():
    torch = pytest.importorskip("torch", reason="PyTorch is an optional peer (pip install torch)")
    numbers = np.random.default_rng(3).normal(size=3000).astype(np.float32) * 50
    numbers = np.concatenate(
        [numbers, np.float32([0.0, -0.0, 464.0, 470.0, 61440.0, 1e6, -1e6, np.inf, np.nan])]
    )
    torch_dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    torch_dtypes |= {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    for name, torch_dtype in torch_dtypes.items():
        converted = torch.from_numpy(numbers).to(torch_dtype)
        view = torch.uint8 if converted.element_size() == 1 else torch.int16
        assert raw(numbers, name, "native") == converted.view(view).numpy().tobytes(), name
