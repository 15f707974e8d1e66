"""Correctness on an accelerator, in float32, bfloat16 and float16 (marker `gpu`).

Skipped, with the reason, where MAX sees no accelerator.
"""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental.tensor import Tensor

from max_gpt2.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import check
from tests.support import GPT2_SMALL, GPT2_XL, LAYOUTS, ODD, SEQ_LENS, layout_id, random_input, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

CASES = [(config, "float32") for config in LAYOUTS] + [
    (config, dtype) for config in (GPT2_SMALL, GPT2_XL, ODD) for dtype in ("bfloat16", "float16")
]


@pytest.mark.parametrize(("config", "dtype"), CASES, ids=[f"{layout_id(c)}-{d}" for c, d in CASES])
@pytest.mark.parametrize("seq_len", [*SEQ_LENS, 1024])
@pytest.mark.parametrize("batch", [1, 4])
def test_matches_reference_on_gpu(compiled, config, dtype, batch, seq_len):
    weights = random_attention_weights(config, seed=seq_len)
    attention = compiled(config, dtype, "gpu").with_weights(weights)
    x = random_input(batch, seq_len, config.n_embd)
    comparison = check(attention(x), x, weights, config.n_head, dtype)
    assert comparison.passed, comparison


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_causality_on_gpu(compiled, dtype):
    attention = compiled(ODD, dtype, "gpu")
    x = random_input(2, 33, ODD.n_embd)
    changed = x.copy()
    changed[:, 20] += 3.0
    np.testing.assert_array_equal(attention(changed)[:, :20], attention(x)[:, :20])


def test_device_tensors_stay_on_the_device(compiled):
    attention = compiled(GPT2_SMALL, "bfloat16", "gpu")
    x = random_input(2, 16, GPT2_SMALL.n_embd)
    on_device = Buffer.from_numpy(float32_to_bfloat16_bits(x)).view(DType.bfloat16).to(attention.device)
    result = attention(on_device)
    assert isinstance(result, Tensor) and result.dtype == DType.bfloat16
    back = Buffer.from_dlpack(result).to(CPU()).view(DType.uint16)
    np.testing.assert_array_equal(bfloat16_bits_to_float32(np.from_dlpack(back)), attention(x))
    from_host = attention(
        Tensor.from_dlpack(Buffer.from_numpy(float32_to_bfloat16_bits(x)).view(DType.bfloat16))
    )
    assert isinstance(from_host, Tensor)  # a host tensor is moved to the device, not refused
