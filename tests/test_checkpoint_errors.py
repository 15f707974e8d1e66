"""Bad checkpoints: every case raises a clear exception naming the file, key or shape that is wrong."""

from __future__ import annotations

import json
import pickle
import re
import struct
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from max_gpt2 import CheckpointError, load_attention_weights
from max_gpt2.testing import write_checkpoint
from tests.support import ODD


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


def test_a_gguf_file_is_named_as_one(tmp_path):
    """The attention's loader reads safetensors: a GGUF file is refused as what it is, not as a bad header."""
    (tmp_path / "gpt2.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ValueError, match=r"gpt2.gguf is a GGUF file, and this reads safetensors checkpoints"):
        load_attention_weights(tmp_path / "gpt2.gguf", 0)


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
    for stray in (None, "../../../../etc/passwd", "/etc/passwd"):  # each entry a shard's name beside it
        index.write_text(json.dumps({"weight_map": {"wte.weight": stray}}))
        with pytest.raises(
            CheckpointError, match=rf"weight_map\['wte.weight'\] is {re.escape(repr(stray))}, not a"
        ):
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


def test_a_tensor_stored_in_two_shards_is_refused(tmp_path):
    """Which copy would be read depended on the order of the files; both are named instead."""
    path = write_checkpoint(tmp_path, ODD, shards=2)
    first, second = sorted(path.glob("model-*.safetensors"))
    stored = load_file(first)
    key = next(iter(stored))
    save_file({**load_file(second), key: stored[key]}, second)
    with pytest.raises(
        CheckpointError,
        match=rf"tensor {re.escape(key)} is stored twice, in .*{first.name} "
        rf"and in .*{second.name}",
    ):
        load_attention_weights(path, 0)


def test_tensors_no_parameter_reads_are_named_in_a_warning(tmp_path):
    """As Hugging Face warns of a checkpoint's unused weights: a layer past the config's and another
    model's head are named; the causal-mask buffers older files keep are not."""
    path = write_checkpoint(tmp_path, ODD)
    tensors = load_file(path / "model.safetensors")
    mask = np.tril(np.ones((1, 1, 8, 8), dtype=np.float32))
    extra = {"h.3.attn.c_attn.weight": tensors["h.0.attn.c_attn.weight"], "score.weight": np.ones((2, 60))}
    save_file(
        {**tensors, "h.0.attn.bias": mask, "h.1.attn.masked_bias": mask[0, 0, 0]}, path / "model.safetensors"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_attention_weights(path, 0)  # the mask buffers alone: no warning
    save_file({**tensors, **extra}, path / "model.safetensors")
    with pytest.warns(
        UserWarning,
        match=r"2 tensors in .*model.safetensors are not GPT-2's parameters and "
        r"are not used: h\.3\.attn\.c_attn\.weight, score\.weight$",
    ):
        assert load_attention_weights(path, 0)
