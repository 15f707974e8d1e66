"""A float16 KV cache (`kv_cache="float16"`, packed weights' default): keys and values rounded as
stored, attention in float32."""

from __future__ import annotations

import numpy as np
import pytest
from max.dtype import DType

from max_gpt2 import load_lm, reference
from max_gpt2.inference.lm_options import LMOptions
from max_gpt2.model.formats import FORMATS
from tests.support import LM_ONE_LAYER, prompt_and_steps

# Largest |logit error| over largest |logit| against the float64 reference (LM_ONE_LAYER's random
# weights, float32 compute): keys and values rounded to float16 (relative 2^-11) move the
# attention scores and outputs by about that much.
ON_THE_REFERENCE = 2e-3  # measured 3.9e-4 (a float32 cache: about 1e-6)


@pytest.fixture(scope="module")
def lm(compiled_lm):
    """Float32 weights and compute, a float16 cache: prompts through MAX's ops, steps through the kernel."""
    return compiled_lm(LM_ONE_LAYER, kv_cache="float16")


def test_the_cache_is_float16(lm):
    cache = lm.new_cache(2, 5)
    assert lm.kv_dtype == DType.float16
    assert all(buffer.dtype == DType.float16 for buffer in cache.buffers)
    assert "kv_cache='float16'" in repr(lm)


def test_a_float16_cache_tracks_the_reference(lm, lm_weights):
    ids = np.random.default_rng(7).integers(0, LM_ONE_LAYER.vocab_size, (2, 9))
    got = prompt_and_steps(lm, ids, 6)
    expected = reference.lm_logits_and_largest_score(ids, lm_weights(LM_ONE_LAYER), LM_ONE_LAYER)[0]
    error = np.abs(got - expected).max() / np.abs(expected).max()
    assert 0 < error <= ON_THE_REFERENCE, error  # 0 would mean the keys were never rounded


def test_steps_through_the_kernel_round_as_the_prompt_graph_does(lm):
    """The prompt graph (MAX's ops) and the steps (the Mojo kernel) store the same float16 keys and
    values, so a sequence run as steps gives the logits of the same sequence run as one prompt."""
    ids = np.random.default_rng(8).integers(0, LM_ONE_LAYER.vocab_size, (3, 10))
    whole = lm.logits(ids)
    steps = prompt_and_steps(lm, ids, 3)
    np.testing.assert_allclose(steps, whole, rtol=0, atol=2e-5 * np.abs(whole).max())


@pytest.mark.parametrize(
    ("kv_cache", "dtype", "message"),
    [
        ("int8", DType.float32, "kv_cache must be one of float32, bfloat16, float16; got 'int8'"),
        ("float16", DType.bfloat16, "kv_cache='float16' with bfloat16 compute"),
        ("bfloat16", DType.float32, "kv_cache='bfloat16' with float32 compute"),
    ],
)
def test_unsupported_caches_are_refused(kv_cache, dtype, message):
    with pytest.raises(ValueError, match=message):
        LMOptions.check("cpu", dtype, kv_cache=kv_cache)


@pytest.mark.parametrize(
    ("weights", "dtype", "expected"),
    [
        ("float32", DType.float32, DType.float32),  # Hugging Face's numbers
        ("bfloat16", DType.float32, DType.float16),  # beside a packed format, as llama.cpp keeps it
        ("q8_0", DType.float32, DType.float16),
        ("q4_0", DType.float32, DType.float16),
        ("float32", DType.bfloat16, DType.bfloat16),
        ("float32", DType.float16, DType.float16),
    ],
)
def test_the_default_cache_is_float16_beside_packed_weights_only(weights, dtype, expected):
    assert FORMATS[weights].cache_dtype(None, dtype) == expected
    assert FORMATS[weights].cache_dtype(DType.float32, DType.float32) == DType.float32  # asked for: kept


def test_load_lm_refuses_a_bad_cache_before_reading(tmp_path):
    with pytest.raises(ValueError, match="kv_cache='float16' with bfloat16 compute"):
        load_lm(tmp_path / "missing", "cpu", "bfloat16", kv_cache="float16")
