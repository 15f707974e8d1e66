"""The `flash` implementation against the reference, and how `impl` is chosen.

`wrapper`, a benchmark baseline, is compared with the reference in tests/test_gpu.py, and by
`max-gpt2 bench` itself before it times anything: its CPU graph is a compile this suite skips.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor, TensorType, default_device, default_dtype

from max_gpt2 import compile_attention
from max_gpt2.inference.attention import CPU_FLASH_TILES, IMPLEMENTATIONS, resolve_impl
from max_gpt2.model.layers.flash import KernelFlashAttention
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import check
from tests.support import GPT2_SMALL, ODD, random_input

# Lengths around the tile count: shorter than it, multiples, and the padded ones between.
SEQ_LENS = [1, 2, 3, CPU_FLASH_TILES, 5, 7, 64, 129]


@pytest.mark.parametrize("impl", ["flash"])
@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("batch", [1, 3])
def test_matches_reference(compiled, impl, batch, seq_len):
    weights = random_attention_weights(ODD, seed=seq_len)
    attention = compiled(ODD, impl=impl).with_weights(weights)
    assert attention.impl == impl
    x = random_input(batch, seq_len, ODD.n_embd)
    result = attention(x)
    assert result.shape == x.shape
    comparison = check(result, x, weights, ODD.n_head, "float32")
    assert comparison.passed, comparison


@pytest.mark.parametrize("impl", ["flash"])
def test_agrees_with_the_graph_implementation(compiled, impl):
    x = random_input(2, 50, ODD.n_embd, seed=4)
    np.testing.assert_allclose(compiled(ODD, impl=impl)(x), compiled(ODD)(x), rtol=0, atol=1e-5)


def test_flash_is_causal_across_tiles(compiled):
    attention = compiled(ODD, impl="flash")
    x = random_input(2, 40, ODD.n_embd)  # tiles of 10: token 25 sits in the third
    changed = x.copy()
    changed[:, 25] += 3.0
    before, after = attention(x), attention(changed)
    np.testing.assert_array_equal(after[:, :25], before[:, :25])
    assert not np.allclose(after[:, 25:], before[:, 25:])


def test_flash_padding_does_not_leak_into_results(compiled):
    """A length that needs padding gives the same rows as the same tokens in a longer input."""
    attention = compiled(ODD, impl="flash")
    x = random_input(1, 2 * CPU_FLASH_TILES, ODD.n_embd)
    short = CPU_FLASH_TILES + 1  # padded up to 2 * tiles with zeros
    np.testing.assert_allclose(attention(x[:, :short]), attention(x)[:, :short], rtol=0, atol=1e-5)


def test_flash_takes_max_tensors_and_empty_inputs(compiled):
    attention = compiled(ODD, impl="flash")
    x = random_input(2, 9, ODD.n_embd)
    for given in (Tensor.from_dlpack(x), Buffer.from_numpy(x)):
        result = attention(given)
        assert isinstance(result, Tensor) and list(result.shape) == [2, 9, ODD.n_embd]
        np.testing.assert_array_equal(np.from_dlpack(result), attention(x))
    assert attention(np.zeros((2, 0, ODD.n_embd))).shape == (2, 0, ODD.n_embd)


def test_with_weights_keeps_the_implementation(compiled):
    other = compiled(ODD, impl="flash").with_weights(random_attention_weights(ODD, seed=5))
    assert other.impl == "flash" and "impl='flash'" in repr(other)


@pytest.mark.parametrize("dtype", [DType.float32, DType.bfloat16, DType.float16])
def test_auto_on_cpu_is_the_graph(dtype):
    assert resolve_impl("auto", CPU(), dtype) == "graph"


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(DType.bfloat16, "flash"), (DType.float16, "flash"), (DType.float32, "graph")],
)
def test_auto_on_gpu_uses_the_fused_kernel_in_half_precision(dtype, expected):
    gpu = SimpleNamespace(is_host=False)  # resolve_impl only asks where the device is
    assert resolve_impl("auto", gpu, dtype) == expected


@pytest.mark.parametrize("impl", IMPLEMENTATIONS[1:])
def test_explicit_choices_are_kept(impl):
    assert resolve_impl(impl, CPU(), DType.float32) == impl


def test_unknown_impl_is_refused_before_compiling():
    with pytest.raises(
        ValueError, match=r"impl must be one of 'auto', 'graph', 'flash', 'wrapper'; got 'fast'"
    ):
        compile_attention(ODD, random_attention_weights(ODD), "cpu", impl="fast")


def test_kernel_flash_graph_builds():
    """The GPU kernel path stages (shapes, kernel arguments) even where it cannot be compiled."""
    with F.lazy(), default_device(CPU()), default_dtype(DType.bfloat16):
        module = KernelFlashAttention(GPT2_SMALL)
    staged = module.trace(TensorType(DType.bfloat16, ("batch", "seq", GPT2_SMALL.n_embd), device=CPU()))
    assert "mo.mha.no_cache" in str(staged.graph)
