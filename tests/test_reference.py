"""The NumPy reference on its own: independence from MAX, and properties that pin it down."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from max_gpt2 import reference
from max_gpt2.testing import random_attention_weights
from tests.conftest import ODD, random_input


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
