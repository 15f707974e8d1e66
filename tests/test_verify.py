"""The comparison rule: relative error against a tolerance that widens with the largest score."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2.verify import SCORE_SCALE, TOLERANCES, compare, precision


def test_relative_to_the_reference_scale():
    expected = np.array([[[2.0, -4.0]]])
    within = compare(expected + np.array([0.0, 3e-5]), expected, "float32")
    assert within.max_abs_error == pytest.approx(3e-5)
    assert within.relative_error == pytest.approx(7.5e-6)  # 3e-5 against the largest magnitude, 4
    assert within.passed
    assert not compare(expected + np.array([5e-5, 0.0]), expected, "float32").passed


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_tolerance_widens_only_past_the_score_scale(dtype):
    expected = np.ones((1, 1, 1))
    assert compare(expected, expected, dtype, SCORE_SCALE / 2).tolerance == TOLERANCES[dtype]
    assert compare(expected, expected, dtype, 8 * SCORE_SCALE).tolerance == pytest.approx(
        8 * TOLERANCES[dtype]
    )


def test_nan_and_shape_mismatch_fail():
    expected = np.ones((1, 2, 3))
    assert not compare(np.full((1, 2, 3), np.nan), expected, "bfloat16").passed
    with pytest.raises(ValueError, match=r"result shape \(1, 3, 2\) differs"):
        compare(np.ones((1, 3, 2)), expected, "float32")


def test_an_unknown_dtype_is_named():
    with pytest.raises(ValueError, match=r"dtype must be one of .*float32.*, got 'float99'"):
        compare(np.zeros(3), np.zeros(3), "float99")


def test_float32_on_a_gpu_is_held_to_the_tf32_tolerance():
    """An error of 1e-3, what TF32 matmuls leave, passes float32 on a GPU and fails it on the CPU."""
    expected = np.linspace(-1.0, 1.0, 11)
    result = expected + 1e-3
    assert compare(result, expected, precision("float32", on_accelerator=True)).passed
    assert not compare(result, expected, precision("float32", on_accelerator=False)).passed
    assert [precision(dtype, True) for dtype in ("bfloat16", "float16")] == ["bfloat16", "float16"]
