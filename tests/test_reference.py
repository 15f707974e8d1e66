"""The NumPy reference on its own: independence from MAX, and properties that pin it down."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from max_gpt2 import reference
from max_gpt2.testing import random_attention_weights
from tests.support import ODD, random_input


def test_reference_imports_nothing_from_max():
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "collections.abc", "numpy"}, imported


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
