"""The compiled language model: logits against the float64 reference, cached decoding, loading and
bad input (generation: test_generation.py)."""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Module
from max.experimental.tensor import Tensor, TensorType

from max_gpt2 import GPT2Config, load_lm, reference
from max_gpt2.model.config import ACTIVATIONS
from max_gpt2.model.layers.block import activation
from max_gpt2.model.layers.variants import DECODE, PLAIN
from max_gpt2.verify import compare
from tests.support import LM, LM_ONE_LAYER, left_padding, prompts

LMS = [LM, LM_ONE_LAYER]


def layers_id(config: GPT2Config) -> str:
    return f"{config.n_layer}-layer"


def assert_logits_match_reference(lm, weights, ids, mask=None) -> None:
    expected, largest_score = reference.lm_logits_and_largest_score(ids, weights, lm.config, mask)
    real = np.ones(ids.shape, bool) if mask is None else mask.astype(bool)
    comparison = compare(lm.logits(ids, mask)[real], expected[real], "float32", largest_score)
    assert comparison.passed, comparison


@pytest.mark.parametrize("config", LMS, ids=layers_id)
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("seq_len", [1, 5, 17])
def test_logits_match_the_reference(compiled_lm, lm_weights, config, batch, seq_len):
    lm, weights = compiled_lm(config), lm_weights(config)
    ids = prompts(config, batch, seq_len, seed=seq_len)
    assert lm.logits(ids).shape == (batch, seq_len, config.vocab_size)
    assert lm.logits(ids).dtype == np.float32
    assert_logits_match_reference(lm, weights, ids)


@pytest.mark.parametrize("config", LMS, ids=layers_id)
@pytest.mark.parametrize("batch", [2, 3])
def test_left_padded_logits_match_the_reference(compiled_lm, lm_weights, config, batch):
    lm, weights = compiled_lm(config), lm_weights(config)
    ids, mask = prompts(config, batch, 9, seed=batch), left_padding(batch, 9)
    assert_logits_match_reference(lm, weights, ids, mask)


def test_padding_changes_nothing_real(compiled_lm):
    """A prompt's logits are the same alone and left-padded in a batch, whatever the padding holds."""
    lm = compiled_lm(LM)
    ids, mask = prompts(LM, 3, 10, seed=4), left_padding(3, 10)
    batched = lm.logits(ids, mask)
    other_padding = np.where(mask == 1, ids, (ids + 7) % LM.vocab_size)
    np.testing.assert_array_equal(lm.logits(other_padding, mask)[mask == 1], batched[mask == 1])
    for row in range(3):
        alone = lm.logits(ids[row : row + 1, 2 * row :])[0]
        comparison = compare(batched[row, 2 * row :], alone.astype(np.float64), "float32")
        assert comparison.passed, (row, comparison)


def test_another_checkpoint_on_the_same_graph(compiled_lm, lm_weights):
    other = lm_weights(LM, seed=5)
    lm = compiled_lm(LM).with_weights(other)
    assert_logits_match_reference(lm, other, prompts(LM, 2, 6))
    assert not np.allclose(lm.logits(prompts(LM, 2, 6)), compiled_lm(LM).logits(prompts(LM, 2, 6)))


def test_an_untied_head_is_used(compiled_lm, lm_weights):
    weights = dict(lm_weights(LM))
    weights["lm_head.weight"] = np.random.default_rng(9).standard_normal((LM.vocab_size, LM.n_embd)) * 0.02
    lm = compiled_lm(LM).with_weights(weights)
    assert_logits_match_reference(lm, weights, prompts(LM, 1, 4))


# Cached decoding.


@pytest.mark.parametrize("config", LMS, ids=layers_id)
def test_every_cached_step_equals_recomputation(compiled_lm, config):
    """Each step's logits, read from the KV cache, equal a full forward over the same tokens."""
    lm = compiled_lm(config)
    ids, mask = prompts(config, 3, 6, seed=2), left_padding(3, 6)
    steps = list(lm.stream(ids, 12, mask))
    assert len(steps) == 12
    generated = np.stack([step.tokens for step in steps], axis=1)
    full_ids = np.concatenate([ids, generated], axis=1)
    full = lm.logits(full_ids, np.concatenate([mask, np.ones_like(generated)], axis=1))
    for index, step in enumerate(steps):
        expected = full[:, ids.shape[1] - 1 + index].astype(np.float64)
        comparison = compare(step.logits, expected, "float32")
        assert comparison.passed, (index, comparison)
        np.testing.assert_array_equal(step.tokens, np.argmax(step.logits, axis=-1))


def test_prefill_and_decode_steps_by_hand_equal_the_full_forward(compiled_lm):
    """The public steps (`new_cache`, `prefill`, `decode_step`) with tokens of our choosing."""
    lm = compiled_lm(LM)
    ids, mask = prompts(LM, 2, 5, seed=3), left_padding(2, 5)
    fed = prompts(LM, 2, 4, seed=4)  # not what the model would pick: teacher forcing
    cache = lm.new_cache(2, 5 + 4)
    logits = [lm.prefill(ids, cache, mask)] + [lm.decode_step(fed[:, i], cache) for i in range(3)]
    assert cache.length == 8
    full = lm.logits(
        np.concatenate([ids, fed[:, :3]], axis=1), np.concatenate([mask, np.ones((2, 3), int)], 1)
    )
    for index, step in enumerate(logits):
        comparison = compare(step, full[:, 4 + index].astype(np.float64), "float32")
        assert comparison.passed, (index, comparison)
    np.testing.assert_array_equal(cache.next_positions()[:, 0], mask.sum(axis=1) + 3)


def test_the_prompt_and_step_graphs_are_compiled_as_one_module(compiled_lm):
    """On the CPU in float32 they differ (MAX's ops, the Mojo kernels) and compile together, so the
    kernels they share compile once; the tests above check what each computes."""
    lm = compiled_lm(LM)
    artifact = lm.graph.compiled(PLAIN)
    assert lm.graph.compiled(DECODE) is artifact
    names = lm.graph.graph_names(artifact)
    assert set(names) == {PLAIN, DECODE} and names[PLAIN] != names[DECODE]


def test_the_steps_refuse_what_does_not_fit_the_cache(compiled_lm):
    lm = compiled_lm(LM)
    cache = lm.new_cache(1, 3)
    with pytest.raises(ValueError, match="decoding needs a cache that holds a prompt"):
        lm.decode_step([1], cache)
    with pytest.raises(ValueError, match=r"a prompt of shape \[2, 3\] does not fit a cache of 1 rows"):
        lm.prefill([[1, 2, 3], [4, 5, 6]], cache)
    lm.prefill([[1, 2]], cache)
    with pytest.raises(ValueError, match="prefill needs an empty cache; this one holds 2 positions"):
        lm.prefill([[1, 2]], cache)
    with pytest.raises(ValueError, match=r"tokens must have shape \[batch=1\], one per row, got \[2\]"):
        lm.decode_step([1, 2], cache)
    with pytest.raises(ValueError, match=r"tokens\[0\] = 320 is outside the vocabulary \(0..319\)"):
        lm.decode_step([320], cache)
    lm.decode_step([1], cache)
    with pytest.raises(ValueError, match="the cache is full: all 3 positions are written"):
        lm.decode_step([1], cache)
    with pytest.raises(ValueError, match="a cache of 49 positions is longer than the model's n_positions=48"):
        lm.new_cache(1, 49)


# Loading, and bad input.


def test_load_lm_from_a_checkpoint(compiled_lm, lm_checkpoint):
    compiled_lm(LM)  # the graph is then in MAX's cache
    lm = load_lm(lm_checkpoint(LM), device="cpu")
    assert repr(lm) == (
        "CompiledLM(n_layer=3, n_embd=60, n_head=5, vocab_size=320, device='cpu', dtype='float32')"
    )
    ids = prompts(LM, 2, 6)
    np.testing.assert_array_equal(lm.logits(ids), compiled_lm(LM).logits(ids))


BAD_CALLS = [
    ({"input_ids": np.zeros((1, 0), int)}, ValueError, r"input_ids is empty \(shape \[1, 0\]\)"),
    ({"input_ids": np.zeros((0, 3), int)}, ValueError, r"input_ids is empty"),
    (
        {"input_ids": [[1, 2, 320]]},
        ValueError,
        r"input_ids\[0, 2\] = 320 is outside the vocabulary \(0..319\)",
    ),
    ({"input_ids": [[-1, 2]]}, ValueError, r"input_ids\[0, 0\] = -1 is outside"),
    ({"input_ids": [1, 2, 3]}, ValueError, r"input_ids must have shape \[batch, seq\], got \[3\]"),
    ({"input_ids": [[1.0, 2.0]]}, TypeError, r"input_ids must hold integers, got dtype float64"),
    ({"input_ids": [[1, 2], [3]]}, ValueError, r"input_ids must be a \[batch, seq\] array, its rows of one"),
    ({"input_ids": [[2**64]]}, ValueError, r"input_ids holds an integer past int64"),
    ({"input_ids": np.array([[2**64 - 1]], np.uint64)}, ValueError, r"input_ids holds 18446744073709551615"),
    ({"attention_mask": [[1, 1]]}, ValueError, r"attention_mask has shape \[1, 2\], input_ids \[2, 3\]"),
    ({"attention_mask": [[1, 2, 1], [1, 1, 1]]}, ValueError, r"only 0 \(padding\) and 1 \(token\)"),
    ({"attention_mask": [[0, 0, 0], [1, 1, 1]]}, ValueError, r"rows \[0\] are all padding"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS)
def test_bad_prompts_are_refused(compiled_lm, call, error, message):
    lm = compiled_lm(LM)
    arguments = {"input_ids": [[1, 2, 3], [4, 5, 6]], "attention_mask": None} | call
    with pytest.raises(error, match=message):
        lm.logits(**arguments)
    with pytest.raises(error, match=message):
        lm.generate(max_new_tokens=2, **arguments)


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        ([1.5, 2.5], TypeError, r"token ids must hold integers, got dtype float64"),
        ([True, False], TypeError, r"token ids must hold integers, got dtype bool"),
        ([1, -1], ValueError, r"token ids\[1\] = -1 is outside the vocabulary \(0..319\)"),
        ([1, 320], ValueError, r"token ids\[1\] = 320 is outside the vocabulary \(0..319\)"),
        ([[1, 2]], ValueError, r"token ids must have shape \[seq\], got \[1, 2\]"),
    ],
)
def test_perplexity_checks_its_ids_as_the_other_calls_do(compiled_lm, ids, error, message):
    with pytest.raises(error, match=message):
        compiled_lm(LM).perplexity(ids)


def test_too_long_for_the_context(compiled_lm):
    with pytest.raises(
        ValueError, match=r"49 prompt tokens = 49 positions, but the model has n_positions=48"
    ):
        compiled_lm(LM).logits(np.zeros((1, 49), int))


def test_weights_that_do_not_fit(compiled_lm, lm_weights):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    with pytest.raises(
        ValueError, match=r"'transformer.h.1.mlp.c_fc.bias' has shape \(3,\), .* needs \(240,\)"
    ):
        lm.with_weights({**weights, "transformer.h.1.mlp.c_fc.bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\], unexpected \[\]"):
        lm.with_weights({name: value for name, value in weights.items() if name != "lm_head.weight"})


def test_every_activation_hugging_face_names_matches_the_reference():
    """The MLP's activation for each name the config accepts, in one small graph, against NumPy."""
    kinds = sorted(set(ACTIVATIONS.values()))

    class Activations(Module[[Tensor], Tensor]):
        def forward(self, x: Tensor) -> Tensor:
            return F.stack([activation(kind, x) for kind in kinds])

    compiled = Activations().compile(TensorType(DType.float32, ["n"], device=CPU()))
    x = np.linspace(-6, 6, 97, dtype=np.float32)
    results = np.from_dlpack(compiled(Buffer.from_numpy(x)))
    for name, kind in ACTIVATIONS.items():
        expected = reference.activation(x.astype(np.float64), name)
        np.testing.assert_allclose(results[kinds.index(kind)], expected, rtol=1e-5, atol=2e-6, err_msg=name)
