"""Correctness on an accelerator (marker `gpu`): attention in float32, bfloat16 and float16, graph and
flash; the whole language model in float32 and bfloat16. float32 is held to the TF32 tolerance there
(`max_gpt2.verify.precision`: MAX multiplies float32 matrices on TF32 tensor cores).

Skipped, with the reason, where MAX sees no accelerator.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer
from max.dtype import DType
from max.experimental.tensor import Tensor

from max_gpt2 import GPT2Config, reference
from max_gpt2.inference.devices import parse_dtype
from max_gpt2.inference.sampling import Sampler
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.gpu_limits import hopper_attention_weights_refusal, hopper_refusal
from max_gpt2.reference import softmax
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import check, compare, precision
from tests.support import (
    GPT2_SMALL,
    GPT2_XL,
    HAS_GPU,
    LAYOUTS,
    LM,
    ODD,
    SEQ_LENS,
    SINGLE_HEAD,
    layout_id,
    random_input,
    requires_gpu,
)
from tests.test_scoring import reference_logprobs

pytestmark = [pytest.mark.gpu, requires_gpu]

ARCHITECTURE = Accelerator().architecture_name if HAS_GPU else ""
# LM's width, 60, is one MAX cannot compile in bfloat16 on Hopper; this one it can.
GPU_LM = GPT2Config(n_embd=64, n_head=4, n_layer=3, n_positions=48, vocab_size=320)


def refused_here(compile_it, config: GPT2Config, dtype: str) -> bool:
    """Whether this GPU refuses `config` in `dtype` (`hopper_refusal`), after checking that
    `compile_it()` raises the refusal's message instead of failing in MAX's compiler."""
    reason = hopper_refusal(ARCHITECTURE, parse_dtype(dtype), config.n_embd)
    if reason:
        with pytest.raises(ValueError, match=re.escape(reason)):
            compile_it()
    return reason is not None


CASES = (
    [(config, "float32", "graph") for config in LAYOUTS]
    + [(config, dtype, "graph") for config in (GPT2_SMALL, GPT2_XL, ODD) for dtype in ("bfloat16", "float16")]
    # The flash kernel in every dtype; float32 support in MAX's kernel is checked here, not assumed.
    + [(config, dtype, "flash") for config in (GPT2_SMALL, GPT2_XL) for dtype in ("bfloat16", "float16")]
    + [(GPT2_SMALL, "float32", "flash")]
    # The one-head-at-a-time baseline, on the GPU only: on CPU the benchmark checks it when it runs.
    + [(config, "float32", "wrapper") for config in (GPT2_SMALL, ODD)]
)


@pytest.mark.parametrize(
    ("config", "dtype", "impl"), CASES, ids=[f"{layout_id(c)}-{d}-{i}" for c, d, i in CASES]
)
@pytest.mark.parametrize("seq_len", [*SEQ_LENS, 1024])
@pytest.mark.parametrize("batch", [1, 4])
def test_matches_reference_on_gpu(compiled, config, dtype, impl, batch, seq_len):
    if refused_here(lambda: compiled(config, dtype, "gpu", impl), config, dtype):
        return
    weights = random_attention_weights(config, seed=seq_len)
    attention = compiled(config, dtype, "gpu", impl).with_weights(weights)
    x = random_input(batch, seq_len, config.n_embd)
    comparison = check(attention(x), x, weights, config.n_head, precision(dtype, on_accelerator=True))
    assert comparison.passed, comparison


def test_single_head_equals_plain_attention(compiled):
    """On the GPU: on CPU, a single head runs inside tests/test_lm.py's one-layer model."""
    # One head is textbook attention: separate query, key and value maps (the thirds of
    # c_attn), softmax(q k^T / sqrt(d)) over the past, then the output projection.
    weights = random_attention_weights(SINGLE_HEAD, seed=5)
    d = SINGLE_HEAD.n_embd
    x = random_input(3, 17, d).astype(np.float64)
    w, b = weights["c_attn.weight"].astype(np.float64), weights["c_attn.bias"].astype(np.float64)
    q, k, v = (x @ w[i * d : (i + 1) * d].T + b[i * d : (i + 1) * d] for i in range(3))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    scores[:, np.triu_indices(17, 1)[0], np.triu_indices(17, 1)[1]] = -np.inf
    expected = softmax(scores) @ v @ weights["c_proj.weight"].T.astype(np.float64) + weights["c_proj.bias"]
    result = compiled(SINGLE_HEAD, "float32", "gpu").with_weights(weights)(x)
    assert compare(result, expected, precision("float32", on_accelerator=True)).passed


def test_float16_results_come_back_as_float16(compiled):
    if refused_here(lambda: compiled(ODD, "float16", "gpu"), ODD, "float16"):
        return
    assert compiled(ODD, "float16", "gpu")(random_input(1, 3, ODD.n_embd)).dtype == np.float16


def test_auto_picks_the_flash_kernel_for_bfloat16(compiled):
    assert compiled(GPT2_SMALL, "bfloat16", "gpu", "auto").impl == "flash"


def test_flash_runs_16k_tokens(compiled):
    """Batch 1, 16384 tokens in bfloat16: the first rows match the reference, all are finite."""
    attention = compiled(GPT2_SMALL, "bfloat16", "gpu", "flash")
    x = random_input(1, 16384, GPT2_SMALL.n_embd)
    result = attention(x)
    assert result.shape == x.shape and np.isfinite(result).all()
    head = 512  # causal: these rows depend on the first 512 tokens only
    weights = random_attention_weights(GPT2_SMALL)
    assert check(result[:, :head], x[:, :head], weights, GPT2_SMALL.n_head, "bfloat16").passed


@pytest.mark.parametrize(
    ("dtype", "impl"), [("float32", "graph"), ("bfloat16", "graph"), ("bfloat16", "flash")]
)
def test_causality_on_gpu(compiled, dtype, impl):
    attention = compiled(GPT2_SMALL, dtype, "gpu", impl)
    x = random_input(2, 33, GPT2_SMALL.n_embd)
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


# The whole language model on the accelerator.


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lm_logits_match_the_reference_on_gpu(compiled_lm, lm_weights, dtype):
    lm, weights = compiled_lm(GPU_LM, dtype, "gpu"), lm_weights(GPU_LM)
    ids = np.random.default_rng(0).integers(0, GPU_LM.vocab_size, (3, 11))
    mask = (np.arange(11)[None, :] >= np.array([[0], [2], [5]])).astype(np.int64)
    expected, largest_score = reference.lm_logits_and_largest_score(ids, weights, GPU_LM, mask)
    real = mask.astype(bool)
    comparison = compare(
        lm.logits(ids, mask)[real], expected[real], precision(dtype, on_accelerator=True), largest_score
    )
    assert comparison.passed, comparison


def test_lm_generates_on_gpu_what_it_generates_on_cpu(compiled_lm):
    ids = np.random.default_rng(1).integers(0, LM.vocab_size, (2, 6))
    np.testing.assert_array_equal(
        compiled_lm(LM, "float32", "gpu").generate(ids, 24), compiled_lm(LM).generate(ids, 24)
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lm_attentions_match_the_reference_on_gpu(compiled_lm, lm_weights, dtype):
    lm, weights = compiled_lm(GPU_LM, dtype, "gpu"), lm_weights(GPU_LM)
    ids = np.random.default_rng(2).integers(0, GPU_LM.vocab_size, (2, 9))
    mask = (np.arange(9)[None, :] >= np.array([[0], [3]])).astype(np.int64)
    reason = hopper_attention_weights_refusal(ARCHITECTURE, parse_dtype(dtype))
    if reason:
        with pytest.raises(ValueError, match=re.escape(reason)):
            lm.attentions(ids, mask)
        return
    expected = reference.lm_forward(ids, weights, GPU_LM, mask)
    found = lm.attentions(ids, mask)
    tolerance = precision(dtype, on_accelerator=True)
    comparison = compare(found, expected.attentions, tolerance, expected.largest_score)
    assert comparison.passed, comparison
    assert np.all(found[:, 1, :, :, :3] == 0.0)  # padding keys, and padding queries' rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lm_logprobs_match_the_reference_on_gpu(compiled_lm, lm_weights, dtype):
    """The scoring graph (log-softmax and gather after the head) on the accelerator."""
    lm, weights = compiled_lm(GPU_LM, dtype, "gpu"), lm_weights(GPU_LM)
    ids = np.random.default_rng(3).integers(0, GPU_LM.vocab_size, (3, 20))
    mask = (np.arange(20)[None, :] >= np.array([[0], [3], [7]])).astype(np.int64)
    expected = reference_logprobs(ids, weights, mask, GPU_LM)  # NaN where a token has no score
    _, largest_score = reference.lm_logits_and_largest_score(ids, weights, GPU_LM, mask)
    found = lm.logprobs(ids, mask)
    np.testing.assert_array_equal(np.isnan(found), np.isnan(expected))
    scored = ~np.isnan(expected)
    comparison = compare(
        found[scored], expected[scored], precision(dtype, on_accelerator=True), largest_score
    )
    assert comparison.passed, comparison


def test_generation_controls_on_gpu_give_the_cpu_tokens(compiled_lm):
    """Penalties, bias, min_new_tokens and context shift run on the host over the device's logits."""
    ids = np.random.default_rng(4).integers(1, LM.vocab_size, (2, 8))
    sampler = Sampler(
        repetition_penalty=1.3, no_repeat_ngram_size=2, presence_penalty=0.1, logit_bias={5: 2.0}
    )
    options = {"sampler": sampler, "min_new_tokens": 4}
    gpu, cpu = compiled_lm(LM, "float32", "gpu"), compiled_lm(LM)
    np.testing.assert_array_equal(gpu.generate(ids, 16, **options), cpu.generate(ids, 16, **options))
    long = np.random.default_rng(5).integers(1, LM.vocab_size, (1, LM.n_positions - 4))
    np.testing.assert_array_equal(
        gpu.generate(long, 12, context_overflow="shift"), cpu.generate(long, 12, context_overflow="shift")
    )
