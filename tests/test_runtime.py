"""Calling compiled attention: input kinds, conversions, validation, devices."""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental.tensor import Tensor

from max_gpt2 import compile_attention, from_pretrained, load_attention_weights
from max_gpt2.inference.devices import gpu_of, resolve_device
from max_gpt2.model.gpu_limits import (
    GPU,
    check_attention_weights,
    check_compiles,
    hopper_attention_weights_refusal,
    hopper_refusal,
)
from max_gpt2.testing import random_attention_weights, write_checkpoint
from max_gpt2.verify import check
from tests.support import HAS_GPU, ODD


@pytest.fixture
def attention(compiled):
    return compiled(ODD)


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(2).standard_normal((2, 5, ODD.n_embd))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numpy_inputs_of_any_float_dtype(attention, x, dtype):
    result = attention(x.astype(dtype))
    assert isinstance(result, np.ndarray) and result.dtype == np.float32
    assert check(result, x.astype(dtype), random_attention_weights(ODD), ODD.n_head, "float32").passed


def test_non_contiguous_numpy_input(attention, x):
    strided = np.asfortranarray(x)[:, ::-1][:, ::-1]
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(attention(strided), attention(x))


def test_max_tensor_and_dlpack_inputs_return_tensors(attention, x):
    x32 = x.astype(np.float32)
    from_numpy = attention(x32)
    for given in (Tensor.from_dlpack(x32), Buffer.from_numpy(x32)):
        result = attention(given)
        assert isinstance(result, Tensor)
        np.testing.assert_array_equal(np.from_dlpack(result), from_numpy)


def test_empty_sequence_and_batch(attention):
    assert attention(np.zeros((3, 0, ODD.n_embd))).shape == (3, 0, ODD.n_embd)
    assert attention(np.zeros((0, 4, ODD.n_embd))).shape == (0, 4, ODD.n_embd)
    empty = attention(Tensor.from_dlpack(np.zeros((2, 0, ODD.n_embd), np.float32)))
    assert isinstance(empty, Tensor) and list(empty.shape) == [2, 0, ODD.n_embd]


def test_with_weights_leaves_the_original_alone(attention, x):
    before = attention(x)
    other = attention.with_weights(random_attention_weights(ODD, seed=11))
    assert not np.allclose(other(x), before)
    np.testing.assert_array_equal(attention(x), before)


def test_from_pretrained_runs_a_checkpoint_layer(tmp_path, compiled, x):
    compiled(ODD)  # the graph is then in MAX's cache, so this compile is quick
    path = write_checkpoint(tmp_path, ODD, seed=6)
    attention = from_pretrained(path, layer=2, device="cpu")
    assert (
        repr(attention)
        == "CompiledAttention(n_embd=60, n_head=5, device='cpu', dtype='float32', impl='graph')"
    )
    weights = load_attention_weights(path, 2)
    assert check(attention(x), x, weights, ODD.n_head, "float32").passed


# Bad input.


@pytest.mark.parametrize("shape", [(5, ODD.n_embd), (1, 2, 5, ODD.n_embd), (2, 5, ODD.n_embd + 1), ()])
def test_wrong_rank_or_width(attention, shape):
    with pytest.raises(
        ValueError,
        match=rf"x must have shape \[batch, seq, n_embd=60\]; got \[{', '.join(map(str, shape))}\]",
    ):
        attention(np.zeros(shape, np.float32))


def test_wrong_rank_as_tensor(attention):
    with pytest.raises(ValueError, match=r"got \[5, 60\]"):
        attention(Tensor.from_dlpack(np.zeros((5, ODD.n_embd), np.float32)))


def test_integer_input(attention):
    with pytest.raises(TypeError, match="floating-point values; got dtype int64"):
        attention(np.zeros((1, 2, ODD.n_embd), np.int64))


def test_tensor_of_another_dtype(attention):
    with pytest.raises(TypeError, match="x has dtype float64 but this graph computes in float32"):
        attention(Buffer.from_numpy(np.zeros((1, 2, ODD.n_embd))))


def test_not_an_array(attention):
    with pytest.raises(TypeError, match="NumPy array, a MAX Tensor or a DLPack array; got list"):
        attention([[[0.0] * ODD.n_embd]])


def test_weights_are_checked_before_compiling():
    weights = random_attention_weights(ODD)
    with pytest.raises(ValueError, match=r"'c_proj.weight' has shape \(60, 61\).* needs \(60, 60\)"):
        compile_attention(ODD, {**weights, "c_proj.weight": np.zeros((60, 61))}, device="cpu")
    with pytest.raises(ValueError, match=r"missing \['c_proj.bias'\], unexpected \['attn.bias'\]"):
        compile_attention(ODD, {**{k: v for k, v in weights.items() if k != "c_proj.bias"}, "attn.bias": 0})
    with pytest.raises(TypeError, match=r"'c_attn.bias' has dtype int64"):
        compile_attention(ODD, {**weights, "c_attn.bias": np.zeros(180, np.int64)})


def test_bad_device_and_dtype():
    weights = random_attention_weights(ODD)
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'gpu' or 'gpu:N'; got 'tpu'"):
        compile_attention(ODD, weights, device="tpu")
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16; got 'float64'"):
        compile_attention(ODD, weights, dtype="float64")


def test_device_names():
    assert resolve_device("cpu") == CPU()
    assert resolve_device("auto").is_host != HAS_GPU
    if not HAS_GPU:
        with pytest.raises(ValueError, match=r"device 'gpu:0' asked for, but MAX sees 0 accelerator"):
            resolve_device("gpu:0")


def test_what_hopper_cannot_compile_is_refused_by_name():
    assert "use bfloat16" in hopper_refusal("sm_90a", DType.float16, 768)
    assert "got n_embd=60" in hopper_refusal("sm_90a", DType.bfloat16, 60)
    assert hopper_refusal("sm_90a", DType.bfloat16, 768) is None
    assert hopper_refusal("sm_90a", DType.float32, 60) is None
    assert hopper_refusal("sm_80", DType.float16, 60) is None  # only Hopper was measured
    assert gpu_of(CPU()) is None  # the CPU compiles every dtype at every width
    check_compiles(None, DType.float16, 60)
    with pytest.raises(ValueError, match=r"^gpu:1 \(sm_90a\): bfloat16 .* got n_embd=60"):
        check_compiles(GPU("gpu:1", "sm_90a"), DType.bfloat16, 60)


def test_what_hopper_computes_wrong_is_refused_by_name():
    assert "use dtype='float32'" in hopper_attention_weights_refusal("sm_90a", DType.bfloat16)
    assert hopper_attention_weights_refusal("sm_90a", DType.float32) is None  # right there
    assert hopper_attention_weights_refusal("sm_80", DType.bfloat16) is None  # only Hopper was measured
    check_attention_weights(gpu_of(CPU()), DType.bfloat16)  # right there (9.4e-3 from the reference, by hand)
    with pytest.raises(ValueError, match=r"^gpu:0 \(sm_90a\): attention weights in bfloat16"):
        check_attention_weights(GPU("gpu:0", "sm_90a"), DType.bfloat16)


def test_dtype_of_numpy_results(compiled, x):
    assert compiled(ODD, "bfloat16")(x).dtype == np.float32  # NumPy has no bfloat16 (float16: test_gpu.py)


def test_bfloat16_tensors_pass_through(compiled, x):
    attention = compiled(ODD, "bfloat16")
    bits = attention(Buffer.from_numpy(np.zeros((1, 3, 60), np.uint16)).view(DType.bfloat16))
    assert isinstance(bits, Tensor) and bits.dtype == DType.bfloat16


def test_with_weights_checks_the_new_weights(attention):
    with pytest.raises(ValueError, match=r"'c_attn.weight' has shape \(60, 180\).* needs \(180, 60\)"):
        attention.with_weights({**random_attention_weights(ODD), "c_attn.weight": np.zeros((60, 180))})
