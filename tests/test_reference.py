"""The NumPy reference on its own: independence from MAX, and properties that pin it down."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from max_gpt2 import GPT2Config, reference
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.testing import random_attention_weights, write_checkpoint
from tests.support import ODD, random_input


def test_reference_imports_nothing_from_max():
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    # The config is a plain dataclass, imported for annotations only.
    assert imported <= {
        "__future__",
        "collections.abc",
        "math",
        "typing",
        "numpy",
        "max_gpt2.model.config",
    }, imported


def test_a_single_token_attends_only_to_itself():
    # With one key, softmax gives it weight 1: the output is the value, projected.
    weights = {name: value.astype(np.float64) for name, value in random_attention_weights(ODD, 4).items()}
    x = random_input(3, 1, ODD.n_embd).astype(np.float64)
    d = ODD.n_embd
    value = x @ weights["c_attn.weight"][2 * d :].T + weights["c_attn.bias"][2 * d :]
    expected = value @ weights["c_proj.weight"].T + weights["c_proj.bias"]
    np.testing.assert_allclose(reference.attention(x, weights, ODD.n_head), expected, rtol=1e-12, atol=1e-12)


def test_the_first_token_of_a_sequence_sees_only_itself():
    weights = random_attention_weights(ODD, 5)
    x = random_input(2, 6, ODD.n_embd)
    np.testing.assert_allclose(
        reference.attention(x, weights, ODD.n_head)[:, :1], reference.attention(x[:, :1], weights, ODD.n_head)
    )


def test_uniform_scores_average_the_values():
    # Zero query weights make every score 0, so each position averages the values seen so far.
    weights = {name: value.astype(np.float64) for name, value in random_attention_weights(ODD, 6).items()}
    weights["c_attn.weight"][: ODD.n_embd] = 0
    weights["c_attn.bias"][: ODD.n_embd] = 0
    weights["c_proj.weight"] = np.eye(ODD.n_embd)
    weights["c_proj.bias"] = np.zeros(ODD.n_embd)
    x = random_input(1, 5, ODD.n_embd).astype(np.float64)
    d = ODD.n_embd
    values = x @ weights["c_attn.weight"][2 * d :].T + weights["c_attn.bias"][2 * d :]
    running_mean = np.cumsum(values, axis=1) / np.arange(1, 6)[None, :, None]
    np.testing.assert_allclose(
        reference.attention(x, weights, ODD.n_head), running_mean, rtol=1e-12, atol=1e-12
    )


def test_empty_sequence():
    assert reference.attention(
        np.zeros((2, 0, ODD.n_embd)), random_attention_weights(ODD), ODD.n_head
    ).shape == (
        2,
        0,
        ODD.n_embd,
    )


def explicit_scores(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """Every score, future ones included, `[batch, head, query, key]`, by einsum."""
    d, h = ODD.n_embd, ODD.head_dim
    w, b = weights["c_attn.weight"], weights["c_attn.bias"]
    q = (x @ w[:d].T + b[:d]).reshape(*x.shape[:2], ODD.n_head, h)
    k = (x @ w[d : 2 * d].T + b[d : 2 * d]).reshape(*x.shape[:2], ODD.n_head, h)
    return np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(h)


def test_largest_score_is_over_visible_positions_only():
    visible = np.tril(np.ones((6, 6), bool))
    for seed in range(100):  # find inputs whose largest score lies in a query's future
        weights = random_attention_weights(ODD, seed)
        x = random_input(1, 6, ODD.n_embd, seed=seed).astype(np.float64)
        scores = np.abs(explicit_scores(x, weights))
        if scores.max() > scores[..., visible].max():
            break
    _, largest = reference.attention_and_largest_score(x, weights, ODD.n_head)
    assert largest == pytest.approx(scores[..., visible].max(), rel=1e-12)
    assert largest < scores.max()


# The whole model.

TINY = GPT2Config(n_embd=12, n_head=3, n_layer=2, n_positions=16, vocab_size=23)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory) -> dict[str, np.ndarray]:
    return Checkpoint(write_checkpoint(tmp_path_factory.mktemp("tiny"), TINY, seed=2)).model_weights()


def test_padding_is_invisible_to_real_tokens():
    weights = random_attention_weights(ODD, 3)
    x = random_input(1, 7, ODD.n_embd).astype(np.float64)
    key_mask = np.array([[0, 0, 1, 1, 1, 1, 1]], bool)
    padded = reference.attention(x, weights, ODD.n_head, key_mask)
    np.testing.assert_allclose(padded[:, 2:], reference.attention(x[:, 2:], weights, ODD.n_head), rtol=1e-12)
    np.testing.assert_array_equal(padded[:, :2], np.broadcast_to(weights["c_proj.bias"], (1, 2, ODD.n_embd)))


def test_position_ids_count_real_tokens():
    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]])
    np.testing.assert_array_equal(reference.position_ids(mask), [[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 1, 2]])


def test_activation_variants():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    exact = np.array([-0.0040496, -0.1586553, 0.0, 0.3457312, 1.9544997])  # x * Phi(x), from tables
    np.testing.assert_allclose(reference.activation(x, "gelu"), exact, atol=1e-7)
    np.testing.assert_allclose(
        reference.activation(x, "gelu_new"), exact, atol=1e-3
    )  # the tanh approximation
    np.testing.assert_allclose(reference.activation(x, "quick_gelu"), exact, atol=2e-2)
    logistic = np.array([0.0474259, 0.2689414, 0.5, 0.6224593, 0.8807971])  # 1 / (1 + e^-x), from tables
    np.testing.assert_allclose(reference.activation(x, "sigmoid"), logistic, atol=1e-7)
    np.testing.assert_allclose(reference.activation(x, "silu"), x * logistic, atol=1e-7)
    np.testing.assert_array_equal(reference.activation(x, "relu"), [0, 0, 0, 0.5, 2])
    np.testing.assert_array_equal(reference.activation(x, "linear"), x)
    with pytest.raises(ValueError, match="the reference has no activation 'mish'"):
        reference.activation(x, "mish")


def test_layer_norm_standardises():
    x = random_input(2, 3, 16).astype(np.float64) * 5 + 2
    normed = reference.layer_norm(x, np.ones(16), np.zeros(16), 1e-12)
    np.testing.assert_allclose(normed.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(normed.std(axis=-1), 1, rtol=1e-9)


def test_blocks_that_add_nothing_leave_embeddings_to_the_head(tiny_weights):
    """With every attention and MLP output projection zero, logits are ln_f(wte + wpe) @ wte^T."""
    weights = {
        name: np.zeros_like(value) if ".c_proj." in name else value.astype(np.float64)
        for name, value in tiny_weights.items()
    }
    ids = np.array([[3, 1, 4, 1, 5]])
    x = weights["transformer.wte.weight"][ids] + weights["transformer.wpe.weight"][:5]
    normed = reference.layer_norm(
        x, weights["transformer.ln_f.weight"], weights["transformer.ln_f.bias"], 1e-5
    )
    logits, _ = reference.lm_logits_and_largest_score(ids, weights, TINY)
    np.testing.assert_allclose(logits, normed @ weights["transformer.wte.weight"].T, rtol=1e-12)


def test_a_prefix_has_the_same_logits(tiny_weights):
    """Causality of the whole model: later tokens change nothing before them."""
    ids = np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 9))
    full, _ = reference.lm_logits_and_largest_score(ids, tiny_weights, TINY)
    prefix, _ = reference.lm_logits_and_largest_score(ids[:, :4], tiny_weights, TINY)
    np.testing.assert_allclose(full[:, :4], prefix, rtol=1e-12)


def test_left_padding_changes_no_real_logit(tiny_weights):
    ids = np.random.default_rng(1).integers(0, TINY.vocab_size, (1, 6))
    padded_ids = np.concatenate([[[7, 7, 7]], ids], axis=1)
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    alone, _ = reference.lm_logits_and_largest_score(ids, tiny_weights, TINY)
    padded, _ = reference.lm_logits_and_largest_score(padded_ids, tiny_weights, TINY, mask)
    np.testing.assert_allclose(padded[:, 3:], alone, rtol=1e-12)
