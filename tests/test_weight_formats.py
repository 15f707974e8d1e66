"""Weight formats for decoding: quantize and dequantize round trips, and what each format keeps (NumPy)."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2.model import weight_formats as wf
from max_gpt2.model.dtypes import bfloat16_bits_to_float32
from max_gpt2.model.weight_adapters import model_parameter_shapes
from tests.support import LM

SHAPES = [(7, 32), (5, 60), (3, 100), (2, 768), (1, 1)]  # whole blocks, tails, a single value


@pytest.mark.parametrize("shape", SHAPES)
def test_q8_0_keeps_each_weight_within_half_a_step(shape):
    weight = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    values, scales = wf.quantize_q8_0(weight)
    blocks = -(-shape[1] // wf.BLOCK)
    assert values.shape == (shape[0], blocks * wf.BLOCK) and values.dtype == np.int8
    assert scales.shape == (shape[0], blocks) and scales.dtype == np.float16
    assert (values[:, shape[1] :] == 0).all() and np.abs(values).max() <= 127
    restored = wf.dequantize(values, scales, "q8_0", shape[1])
    step = np.repeat(scales.astype(np.float32), wf.BLOCK, axis=1)[:, : shape[1]]
    assert (np.abs(restored - weight) <= step / 2 + 1e-6 * np.abs(weight)).all()
    # A block's largest weight keeps its magnitude up to the scale's float16 rounding.
    assert np.allclose(np.abs(restored).max(axis=1), np.abs(weight).max(axis=1), rtol=2e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_q4_0_keeps_each_weight_within_half_a_step_but_the_clamped(shape):
    """The largest magnitude maps to -8 steps exactly; the other side ends at +7, so values past
    +7.5 steps are clamped there, within a step."""
    weight = np.random.default_rng(sum(shape) + 1).standard_normal(shape).astype(np.float32)
    packed, scales = wf.quantize_q4_0(weight)
    blocks = -(-shape[1] // wf.BLOCK)
    assert packed.shape == (shape[0], blocks * wf.BLOCK // 2) and packed.dtype == np.uint8
    restored = wf.dequantize(packed, scales, "q4_0", shape[1])
    step = np.abs(np.repeat(scales.astype(np.float32), wf.BLOCK, axis=1)[:, : shape[1]])
    error, slack = np.abs(restored - weight), 1e-6 * np.abs(weight)
    clamped = np.isclose(
        restored / np.where(step > 0, step, 1),
        7 * np.sign(scales.astype(np.float32)).repeat(wf.BLOCK, 1)[:, : shape[1]],
    )
    assert (error[~clamped] <= step[~clamped] / 2 + slack[~clamped]).all()
    assert (error <= step + slack).all()


def test_q4_0_nibbles_hold_a_blocks_halves_in_order():
    """llama.cpp's layout: byte j of a block holds element j (low nibble) and element j + 16 (high)."""
    weight = np.concatenate([np.linspace(-8, 7, 16), np.linspace(7, -8, 16)])[None].astype(np.float32)
    packed, scales = wf.quantize_q4_0(weight)
    assert scales[0, 0] == 1.0  # the largest magnitude, -8, maps to q = 0
    np.testing.assert_array_equal(packed[0] & 0xF, np.round(weight[0, :16] + 8))
    np.testing.assert_array_equal(packed[0] >> 4, np.round(weight[0, 16:] + 8))
    np.testing.assert_array_equal(wf.dequantize(packed, scales, "q4_0", 32), np.round(weight))


def test_a_block_of_zeros_stays_zero():
    for quantize, name in ((wf.quantize_q8_0, "q8_0"), (wf.quantize_q4_0, "q4_0")):
        values, scales = quantize(np.zeros((2, 40), np.float32))
        assert (scales == 0).all()
        np.testing.assert_array_equal(wf.dequantize(values, scales, name, 40), np.zeros((2, 40)))


@pytest.mark.parametrize("format", wf.FORMATS)
def test_packing_a_model_packs_the_projections_and_the_head_only(format):
    shapes = model_parameter_shapes(LM)
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    packed = wf.pack(weights, format)
    for name, array in weights.items():
        if format == "float32" or not wf.is_packed(name):
            assert packed[name] is array  # embeddings, norms and biases stay float32, uncopied
    restored = wf.unpack(packed, format, shapes)
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.2.mlp.c_proj.weight", "lm_head.weight"):
        error = np.abs(restored[name] - weights[name]).max() / np.abs(weights[name]).max()
        assert error <= {"float32": 0, "bfloat16": 2**-8, "q8_0": 1 / 127, "q4_0": 1 / 8}[format], name
    if format == "bfloat16":
        np.testing.assert_array_equal(
            restored["lm_head.weight"], bfloat16_bits_to_float32(packed["lm_head.weight"])
        )
    extra = set(packed) - set(weights)
    assert extra == (
        {wf.scales_name(name) for name in weights if wf.is_packed(name)} if "q" in format else set()
    )


def test_unknown_formats_are_refused_with_the_list():
    with pytest.raises(ValueError, match="weights must be one of float32, bfloat16, q8_0, q4_0; got 'int4'"):
        wf.check_format("int4")
