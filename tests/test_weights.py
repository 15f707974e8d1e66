"""The safetensors adapter: every layout, dtype and sharding, checked on values."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from max_gpt2 import Checkpoint, CheckpointError, GPT2Config, load_attention_weights
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.parameters import model_parameter_shapes
from max_gpt2.testing import LAYOUTS, checkpoint_shapes, write_checkpoint
from tests.support import ODD

PARAMETERS = ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as a `dtype` checkpoint stores them, widened back to float32."""
    if dtype == "bfloat16":
        return bfloat16_bits_to_float32(float32_to_bfloat16_bits(values))
    return values.astype(dtype).astype(np.float32)


@pytest.fixture(scope="module")
def float32_tensors(tmp_path_factory) -> dict[str, np.ndarray]:
    """The seed-0 checkpoint's tensors, read by the safetensors library itself (Hub keys)."""
    path = write_checkpoint(tmp_path_factory.mktemp("f32"), ODD, seed=0)
    return load_file(path / "model.safetensors")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("mask_buffers", [True, False])
def test_adapter_reads_transposed_values(tmp_path, float32_tensors, layout, dtype, shards, mask_buffers):
    path = write_checkpoint(
        tmp_path, ODD, seed=0, layout=layout, dtype=dtype, shards=shards, mask_buffers=mask_buffers
    )
    for layer in range(ODD.n_layer):
        weights = load_attention_weights(path, layer)
        assert list(weights) == list(PARAMETERS)
        for name in PARAMETERS:
            stored = float32_tensors[f"h.{layer}.attn.{name}"]  # Conv1D layout: [in, out]
            assert weights[name].dtype == np.float32
            assert weights[name].flags.c_contiguous
            np.testing.assert_array_equal(weights[name], rounded(stored, dtype).T)


def test_square_projection_is_transposed_not_copied(tmp_path, float32_tensors):
    # c_proj.weight is square, so only its values can reveal a missing transpose.
    weights = load_attention_weights(write_checkpoint(tmp_path, ODD), 1)
    stored = float32_tensors["h.1.attn.c_proj.weight"]
    assert not np.array_equal(stored, stored.T)
    np.testing.assert_array_equal(weights["c_proj.weight"], stored.T)


def test_layers_differ(tmp_path):
    checkpoint = Checkpoint(write_checkpoint(tmp_path, ODD))
    first, second = checkpoint.attention_weights(0), checkpoint.attention_weights(1)
    assert not np.array_equal(first["c_attn.weight"], second["c_attn.weight"])


def test_every_entry_point_finds_the_same_weights(tmp_path):
    directory = write_checkpoint(tmp_path / "single", ODD)
    sharded = write_checkpoint(tmp_path / "sharded", ODD, shards=2)
    expected = load_attention_weights(directory, 2)
    for path in (directory / "model.safetensors", sharded, sharded / "model.safetensors.index.json"):
        found = load_attention_weights(path, 2)
        for name in PARAMETERS:
            np.testing.assert_array_equal(found[name], expected[name])


def test_mask_buffers_are_present_but_skipped(tmp_path):
    path = write_checkpoint(tmp_path, ODD, mask_buffers=True)
    with safe_open(str(path / "model.safetensors"), framework="numpy") as handle:
        assert "h.0.attn.bias" in set(handle.keys())  # the buffer that shares "bias" with c_attn.bias
    assert load_attention_weights(path, 0)["c_attn.bias"].shape == (3 * ODD.n_embd,)


def test_writer_is_deterministic_and_complete(tmp_path):
    first = load_file(write_checkpoint(tmp_path / "a", ODD, seed=4) / "model.safetensors")
    second = load_file(write_checkpoint(tmp_path / "b", ODD, seed=4) / "model.safetensors")
    other = load_file(write_checkpoint(tmp_path / "c", ODD, seed=5) / "model.safetensors")
    assert {key: value.shape for key, value in first.items()} == checkpoint_shapes(ODD)
    assert all(np.array_equal(first[key], second[key]) for key in first)
    assert not np.array_equal(first["h.0.attn.c_attn.weight"], other["h.0.attn.c_attn.weight"])
    assert json.loads((tmp_path / "a" / "config.json").read_text())["n_embd"] == ODD.n_embd
    sharded = write_checkpoint(tmp_path / "d", ODD, shards=2)
    assert sorted(file.name for file in sharded.iterdir()) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]  # nothing left under a temporary name


def test_explicit_config_replaces_config_json(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").unlink()
    assert load_attention_weights(path / "model.safetensors", 0, config=ODD)["c_proj.bias"].shape == (60,)


def test_config_is_read_from_the_checkpoint(tmp_path):
    config = GPT2Config(n_embd=32, n_head=4, n_layer=1, n_positions=8, vocab_size=11)
    checkpoint = Checkpoint(write_checkpoint(tmp_path, config, layout="save_pretrained"))
    assert checkpoint.config == config
    assert checkpoint.adapter.prefix == "transformer."
    assert checkpoint.layers_found == 1


# The whole model: every parameter, named as the MAX modules name them.


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shards", [1, 3])
def test_model_weights_are_every_tensor_transposed_where_conv1d(
    tmp_path, float32_tensors, layout, dtype, shards
):
    path = write_checkpoint(tmp_path, ODD, seed=0, layout=layout, dtype=dtype, shards=shards)
    weights = Checkpoint(path).model_weights()
    assert {name: value.shape for name, value in weights.items()} == model_parameter_shapes(ODD)
    for name, value in weights.items():
        stored = float32_tensors[
            "wte.weight" if name == "lm_head.weight" else name.removeprefix("transformer.")
        ]
        conv1d = name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        assert value.dtype == np.float32 and value.flags.c_contiguous
        np.testing.assert_array_equal(value, rounded(stored, dtype).T if conv1d else rounded(stored, dtype))
    assert weights["lm_head.weight"] is weights["transformer.wte.weight"]  # tied: one array


def test_a_stored_lm_head_is_used_even_when_tied(tmp_path):
    """As Hugging Face 5.x loads it (tests/test_peers.py checks that against Hugging Face)."""
    path = write_checkpoint(tmp_path, ODD)
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, "lm_head.weight": np.ones_like(tensors["wte.weight"])}, path / "model.safetensors")
    weights = Checkpoint(path).model_weights()
    np.testing.assert_array_equal(weights["lm_head.weight"], np.ones_like(tensors["wte.weight"]))
    np.testing.assert_array_equal(weights["transformer.wte.weight"], tensors["wte.weight"])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_untied_checkpoint_reads_its_lm_head(tmp_path, layout):
    untied = dataclasses.replace(ODD, tie_word_embeddings=False)
    path = write_checkpoint(tmp_path, untied, layout=layout)
    stored = load_file(path / "model.safetensors")
    assert "lm_head.weight" in stored  # beside `transformer.`, never inside it
    weights = Checkpoint(path).model_weights()
    np.testing.assert_array_equal(weights["lm_head.weight"], stored["lm_head.weight"])
    assert not np.array_equal(weights["lm_head.weight"], weights["transformer.wte.weight"])


def test_an_untied_config_needs_its_lm_head(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").write_text(json.dumps({**ODD.to_dict(), "tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match=r"tensor lm_head.weight is missing .* unties it"):
        Checkpoint(path).model_weights()


def test_model_weights_check_every_shape(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").write_text(json.dumps({**ODD.to_dict(), "vocab_size": 98}))
    with pytest.raises(
        CheckpointError, match=r"wte\.weight .* has shape \(97, 60\).*vocab_size=98.* needs \(98, 60\)"
    ):
        Checkpoint(path).model_weights()
    (path / "config.json").write_text(json.dumps({**ODD.to_dict(), "n_inner": 100}))
    with pytest.raises(
        CheckpointError, match=r"h\.0\.mlp\.c_fc\.weight .* has shape \(60, 240\).* needs \(60, 100\)"
    ):
        Checkpoint(path).model_weights()
