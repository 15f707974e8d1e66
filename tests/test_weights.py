"""The safetensors adapter: every layout, dtype and sharding, checked on values."""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from max_gpt2 import Checkpoint, CheckpointError, GPT2Config, load_attention_weights
from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.weight_adapters import model_parameter_shapes
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


# Bad input: every case raises a clear exception naming what is wrong.


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file or directory: .*nowhere"):
        load_attention_weights(tmp_path / "nowhere", 0)


def test_directory_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(ODD.to_dict()))
    with pytest.raises(FileNotFoundError, match=f"no model.safetensors .* in {tmp_path}"):
        load_attention_weights(tmp_path, 0)


def test_file_that_is_not_safetensors(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "model.safetensors").write_text("this is a README, not a checkpoint\n" * 10)
    with pytest.raises(CheckpointError, match=r"model.safetensors .* is not a valid safetensors file"):
        load_attention_weights(path, 0)


def test_truncated_file(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"not a valid safetensors file.*incomplete"):
        load_attention_weights(path, ODD.n_layer - 1)


def test_header_length_larger_than_file(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    file = path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(struct.pack("<Q", len(data) + 1) + data[8:])
    with pytest.raises(CheckpointError, match=r"not a valid safetensors file.*header"):
        load_attention_weights(path, 0)


def test_missing_tensor_is_named(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    tensors = load_file(path / "model.safetensors")
    del tensors["h.1.attn.c_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    assert load_attention_weights(path, 0)  # other layers still load
    with pytest.raises(CheckpointError, match=r"tensor h\.1\.attn\.c_proj\.weight is missing"):
        load_attention_weights(path, 1)


def test_layer_past_the_last_says_how_many(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    with pytest.raises(IndexError, match=r"layer 3 is out of range: .* has 3 layers \(0 to 2\)"):
        load_attention_weights(path, 3)
    with pytest.raises(IndexError, match="layer -1 is out of range"):
        load_attention_weights(path, -1)
    with pytest.raises(TypeError, match="layer must be an integer"):
        load_attention_weights(path, "0")


def test_shape_that_disagrees_with_config_names_key_and_shapes(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").write_text(json.dumps({**ODD.to_dict(), "n_embd": 40}))
    with pytest.raises(
        CheckpointError, match=r"h\.0\.attn\.c_attn\.weight .* has shape \(60, 180\).* needs \(40, 120\)"
    ):
        load_attention_weights(path, 0)


def test_config_that_does_not_divide_into_heads(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").write_text(json.dumps({**ODD.to_dict(), "n_head": 7}))
    with pytest.raises(ValueError, match=r"n_embd \(60\) must be divisible by n_head \(7\)"):
        load_attention_weights(path, 0)


def test_malformed_config_json(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").write_text('{"n_embd": 60, "n_head": ')
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        load_attention_weights(path, 0)


def test_missing_config_json(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no config.json in .*pass config="):
        load_attention_weights(path, 0)


class _Trap:
    """Unpickling this would create a file: proof that a loader ran pickle code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pytorch_bin_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled"
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(str(marker))))
    (tmp_path / "config.json").write_text(json.dumps(ODD.to_dict()))
    for path in (tmp_path, tmp_path / "pytorch_model.bin"):
        with pytest.raises(
            CheckpointError, match=r"(?s)pytorch_model\.bin is a pickle.*safetensors.*save_file"
        ):
            load_attention_weights(path, 0)
    assert not marker.exists()


def test_unsupported_tensor_dtype(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    tensors = load_file(path / "model.safetensors")
    tensors["h.0.attn.c_attn.bias"] = tensors["h.0.attn.c_attn.bias"].astype(np.float64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"h\.0\.attn\.c_attn\.bias .* has dtype float64"):
        load_attention_weights(path, 0)


def test_broken_index(tmp_path):
    path = write_checkpoint(tmp_path, ODD, shards=2)
    index = path / "model.safetensors.index.json"
    original = index.read_text()
    index.write_text("[]")
    with pytest.raises(CheckpointError, match="not a safetensors index"):
        load_attention_weights(path, 0)
    index.write_text(original)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"names shards that do not exist: .*model-00002-of-00002"):
        load_attention_weights(path, 0)


def test_several_unindexed_files_are_ambiguous(tmp_path):
    path = write_checkpoint(tmp_path, ODD)
    (path / "model.safetensors").rename(path / "a.safetensors")
    (path / "b.safetensors").write_bytes((path / "a.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"several safetensors files \(a.safetensors, b.safetensors\)"):
        load_attention_weights(path, 0)
    (path / "b.safetensors").unlink()
    assert load_attention_weights(path, 0)  # one file, whatever its name, is unambiguous


def test_writer_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="layout must be one of hub, save_pretrained"):
        write_checkpoint(tmp_path, ODD, layout="flat")
    with pytest.raises(ValueError, match="dtype must be one of"):
        write_checkpoint(tmp_path, ODD, dtype="int8")
    with pytest.raises(ValueError, match="shards must be a positive integer"):
        write_checkpoint(tmp_path, ODD, shards=0)


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
