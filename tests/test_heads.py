"""Attention weights from our graphs against the reference; the head summary, gallery and CLI."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from max_gpt2 import reference
from max_gpt2.analysis.gallery import HEADS_PER_IMAGE, draw_gallery, grid_shape, grid_size
from max_gpt2.analysis.head_summary import LABELS, summarize
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.layers.variants import ATTENTIONS, DECODE, PLAIN
from max_gpt2.testing import random_attention_weights, write_checkpoint
from max_gpt2.verify import compare
from tests.support import LM, ODD, random_input, run_python
from tests.test_lm import left_padding, prompts


def assert_weights_are_distributions(weights: np.ndarray, mask: np.ndarray) -> None:
    """`weights` [..., B, H, S, S]: real query rows sum to 1, hidden keys and padding query rows are 0."""
    seq_len = mask.shape[1]
    real = mask.astype(bool)
    visible = real[:, None, None, :] & np.tri(seq_len, dtype=bool)  # [B, 1, S, S]: key real and not later
    visible &= real[:, None, :, None]  # padding queries see nothing
    visible = np.broadcast_to(visible, weights.shape)
    assert np.all(weights[~visible] == 0.0)
    sums = weights.sum(axis=-1)  # [..., B, H, S]
    expected = np.broadcast_to(real[:, None, :], sums.shape).astype(np.float32)
    np.testing.assert_allclose(sums, expected, atol=1e-6)


@pytest.mark.parametrize(("batch", "padded"), [(1, False), (2, False), (3, True)])
def test_lm_attentions_match_the_reference(compiled_lm, lm_weights, batch, padded):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    seq_len = 11
    ids = prompts(LM, batch, seq_len, seed=batch)
    mask = left_padding(batch, seq_len) if padded else np.ones((batch, seq_len), np.int64)
    attentions = lm.attentions(ids, mask if padded else None)
    assert attentions.shape == (LM.n_layer, batch, LM.n_head, seq_len, seq_len)
    assert attentions.dtype == np.float32
    expected = reference.lm_forward(ids, weights, LM, mask)
    comparison = compare(attentions, expected.attentions, "float32", expected.largest_score)
    assert comparison.passed, comparison
    assert_weights_are_distributions(attentions, mask)


def test_padding_never_reaches_the_weights(compiled_lm):
    """A prompt's weights are the same alone and left-padded in a batch, whatever the padding holds."""
    lm = compiled_lm(LM)
    ids, mask = prompts(LM, 3, 10, seed=5), left_padding(3, 10)
    batched = lm.attentions(ids, mask)
    other_padding = np.where(mask == 1, ids, (ids + 11) % LM.vocab_size)
    np.testing.assert_array_equal(lm.attentions(other_padding, mask), batched)
    for row in range(3):
        pad = 2 * row
        alone = lm.attentions(ids[row : row + 1, pad:])[:, 0]
        np.testing.assert_allclose(batched[:, row, :, pad:, pad:], alone, atol=2e-6)


def test_another_checkpoint_reuses_the_graphs(compiled_lm, lm_weights):
    """The prompt, step and attention-weights graphs are compiled once, and shared by `with_weights`."""
    lm = compiled_lm(LM)
    ids = prompts(LM, 2, 6, seed=9)
    lm.attentions(ids)
    # Other tests may have compiled more variants (beam search's "reorder") on the shared graph.
    assert {ATTENTIONS, DECODE, PLAIN} <= set(lm.graph.compiled_variants())
    other = lm.with_weights(lm_weights(LM, seed=1))
    assert other.graph is lm.graph
    expected = reference.lm_forward(ids, lm_weights(LM, seed=1), LM)
    comparison = compare(other.attentions(ids), expected.attentions, "float32", expected.largest_score)
    assert comparison.passed, comparison


def test_standalone_attention_weights_match_the_reference(compiled):
    weights = random_attention_weights(ODD)
    attention = compiled(ODD, impl="flash")  # the weights come from the graph formulation whatever the impl
    x = random_input(2, 13, ODD.n_embd, seed=3)
    found = attention.attentions(x)
    assert found.shape == (2, ODD.n_head, 13, 13) and found.dtype == np.float32
    expected = reference.attend(x, weights, ODD.n_head)
    comparison = compare(found, expected.weights, "float32", expected.largest_score)
    assert comparison.passed, comparison
    assert_weights_are_distributions(found, np.ones((2, 13), np.int64))
    assert attention.attentions(x[:, :0]).shape == (2, ODD.n_head, 0, 0)
    with pytest.raises(ValueError, match=r"x must have shape \[batch, seq, n_embd=60\]; got \[2, 13\]"):
        attention.attentions(x[..., 0])


def previous_token_attention(
    seq_len: int, sharpness: float = 3000.0
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """ODD attention weights whose head 0 must attend to the previous token, and inputs for them.

    Position i is the angle i * theta on a circle (x[..., 0:2]); head 0's query
    turns it back by one step and its key keeps it, so the largest score of
    query i is at key i - 1 (angles stay within half a turn). The other heads
    have zero queries and keys: they spread evenly.
    """
    weights = {name: np.zeros_like(value) for name, value in random_attention_weights(ODD).items()}
    theta = math.pi / seq_len
    c, s = math.cos(theta), math.sin(theta)
    w = weights["c_attn.weight"]  # [3 * 60, 60]: queries, keys, values (MAX Linear layout)
    w[0:2, 0:2] = sharpness * np.array([[c, s], [-s, c]])
    w[ODD.n_embd + 0, 0] = w[ODD.n_embd + 1, 1] = 1.0
    angles = theta * np.arange(seq_len)
    x = np.zeros((1, seq_len, ODD.n_embd), np.float32)
    x[0, :, 0], x[0, :, 1] = np.cos(angles), np.sin(angles)
    return weights, x


def test_the_summary_finds_a_previous_token_head_in_the_graph(compiled):
    weights, x = previous_token_attention(12)
    attention = compiled(ODD, impl="graph").with_weights(weights)
    found = attention.attentions(x)  # [1, H, S, S]
    rows = summarize(found[None])  # one layer
    assert [row.label for row in rows] == ["previous-token"] + ["broad"] * (ODD.n_head - 1)
    assert rows[0].previous > 0.99 and rows[0].entropy < 0.01
    assert all(row.entropy > 0.99 for row in rows[1:])


def constructed(kind: str, seq_len: int) -> np.ndarray:
    """One head's weights [S, S] that attend as `kind` says (the first query always to itself)."""
    weights = np.zeros((seq_len, seq_len))
    for query in range(seq_len):
        key = {"previous-token": max(query - 1, 0), "first-token": 0, "self": query}.get(kind)
        if key is None:
            weights[query, : query + 1] = 1 / (query + 1)
        else:
            weights[query, key] = 1.0
    return weights


def test_the_summary_names_each_kind_of_head():
    heads = np.stack([constructed(kind, 9) for kind in LABELS])[None, None]  # [1, 1, 4, S, S]
    rows = summarize(heads, layers=[7])
    assert [(row.layer, row.head, row.label) for row in rows] == [
        (7, h, kind) for h, kind in enumerate(LABELS)
    ]
    previous, first, itself, broad = rows
    assert previous.previous == 1.0 and previous.itself == 0.0 and previous.entropy == 0.0
    assert first.first == 1.0 and first.previous == pytest.approx(1 / 8)  # query 1's previous is the first
    assert itself.itself == 1.0 and itself.first == 0.0
    assert broad.entropy == pytest.approx(1.0)
    assert broad.to_dict()["self"] == pytest.approx(np.mean([1 / (q + 1) for q in range(1, 9)]))


def test_the_summary_skips_padding_and_needs_two_tokens():
    heads = np.stack([constructed("previous-token", 6)])[None, None]  # one row, no padding
    padded = np.zeros((1, 1, 1, 8, 8))
    padded[..., 2:, 2:] = heads  # the same prompt behind two padding tokens
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1]])
    assert summarize(padded, mask) == summarize(heads)
    with pytest.raises(ValueError, match="at least two real tokens"):
        summarize(padded[..., :3, :3], mask[:, :3])


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header, checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_gallery_is_one_png_for_few_heads(tmp_path):
    attentions = np.stack([[constructed(kind, 6) for kind in LABELS]] * 3)  # [3 layers, 4 heads, S, S]
    summaries = summarize(attentions[:, None], layers=[0, 4, 9])
    paths = draw_gallery(attentions, [0, 4, 9], list("abcdef"), summaries, tmp_path / "heads.png")
    assert paths == [tmp_path / "heads.png"]
    assert (
        png_size(paths[0]) == grid_size(3, 4) == (round((4 * 2.6 + 1.9) * 100), round((3 * 2.6 + 0.9) * 100))
    )
    assert mpimg.imread(paths[0]).shape[:2] == grid_size(3, 4)[::-1]  # decodes as a whole image
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.png"]  # no partial file left


def test_the_gallery_is_one_png_per_layer_for_many_heads(tmp_path):
    n_heads = HEADS_PER_IMAGE // 2 + 1  # two layers of these do not fit one image
    attentions = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, n_heads, 5))  # [2, H, 5, 5]
    summaries = summarize(np.tril(attentions)[:, None], layers=[3, 11])
    paths = draw_gallery(attentions, [3, 11], list("vwxyz"), summaries, tmp_path / "gallery.png")
    assert [p.name for p in paths] == ["gallery-layer3.png", "gallery-layer11.png"]
    (shape,) = set(grid_shape(2, n_heads))
    assert shape == (math.ceil(n_heads / math.ceil(math.sqrt(n_heads))), math.ceil(math.sqrt(n_heads)))
    assert all(png_size(path) == grid_size(*shape) for path in paths)


def run_heads(*args: str):
    return run_python("-m", "max_gpt2", "heads", *args)


def test_heads_draws_and_summarizes_the_prompt(compiled_lm, lm_checkpoint, tmp_path):
    lm, path = compiled_lm(LM), lm_checkpoint(LM)
    out = tmp_path / "heads.png"
    done = run_heads(
        "--checkpoint", str(path), "--prompt", "The cat sat on the mat", "--out", str(out), "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ids = load_tokenizer(path).encode("The cat sat on the mat").ids
    expected = summarize(lm.attentions(np.array([ids])))
    assert [(h["layer"], h["head"], h["label"]) for h in report["heads"]] == [
        (row.layer, row.head, row.label) for row in expected
    ]
    for found, row in zip(report["heads"], expected, strict=True):
        assert found["previous"] == pytest.approx(row.previous, abs=1e-5)
        assert found["entropy"] == pytest.approx(row.entropy, abs=1e-5)
    assert report["images"] == [str(out)] and png_size(out) == grid_size(LM.n_layer, LM.n_head)
    assert f"wrote {out}" in done.stderr


def test_heads_from_token_ids_prints_a_table(compiled_lm, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", LM, seed=0)  # no tokenizer
    out = tmp_path / "layer1.png"
    done = run_heads("--checkpoint", str(path), "--tokens", "5,6,7,8", "--layers", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["layer", "head", "previous", "first", "self", "entropy", "label"]
    assert [line.split()[:2] for line in lines[1:]] == [["1", str(h)] for h in range(LM.n_head)]
    assert png_size(out) == grid_size(1, LM.n_head)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "5,6", "--layers", "3"], r"--layers '3': the checkpoint has 3 layers \(0 to 2\)"),
        (["--tokens", "5"], "at least two tokens"),
        (["--tokens", "5,999"], r"input_ids\[0, 1\] = 999 is outside the vocabulary"),
        (["--tokens", "5,6", "--out", "/no/such/dir/h.png"], "the directory /no/such/dir does not exist"),
    ],
)
def test_heads_refuses_bad_input_before_compiling(lm_checkpoint, args, message):
    done = run_heads("--checkpoint", str(lm_checkpoint(LM)), *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "compiling" not in done.stderr
    assert re.search(message, done.stderr), done.stderr
