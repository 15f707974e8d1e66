"""The weights cache: a checkpoint converted once per weight format and memory-mapped after, a changed
checkpoint converted again, a half-written or damaged file never used."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from max_gpt2.model.checkpoints import stored_weights
from max_gpt2.model.checkpoints.checkpoint import Checkpoint, open_checkpoint
from max_gpt2.model.checkpoints.stored_weights import pack
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.formats import FLOAT32, FORMATS, Q4_0, Q8_0
from max_gpt2.testing import write_checkpoint
from tests.support import LM


def _expected(path, weight_format):
    return pack(Checkpoint(path).model_weights(), FORMATS[weight_format])


def _assert_equal(bound, expected):
    assert set(bound) == set(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(bound[name], array, err_msg=name)


def _mapped(array: np.ndarray) -> bool:
    """Whether `array` is a view of a memory-mapped file."""
    while array is not None and not isinstance(array, np.memmap):
        array = array.base
    return array is not None


@pytest.mark.parametrize("weight_format", ["float32", "bfloat16", "q8_0", "q4_0"])
def test_a_second_load_maps_what_the_first_converted(tmp_path, monkeypatch, weight_format):
    """The first load converts into the cache; the second converts nothing and maps the same file; both
    bind exactly what packing the checkpoint's weights in memory gives."""
    path = write_checkpoint(tmp_path / "checkpoint", LM, seed=0)
    first = bound_weights(Checkpoint(path), FORMATS[weight_format], tmp_path / "cache")
    _assert_equal(first, _expected(path, weight_format))
    assert all(_mapped(array) for array in first.values())
    for part in FORMATS[weight_format].arrays:  # the tied head is wte's arrays, packed or not
        assert first[f"lm_head.{part}"] is first[f"transformer.wte.{part}"]

    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(stored_weights, "store", refuse)
    second = bound_weights(Checkpoint(path), FORMATS[weight_format], tmp_path / "cache")
    _assert_equal(second, first)
    assert len(list((tmp_path / "cache" / "weights").iterdir())) == 1


def test_a_changed_checkpoint_is_converted_again_and_a_copy_is_not(tmp_path):
    path = write_checkpoint(tmp_path / "checkpoint", LM, seed=0)
    cache = tmp_path / "cache"
    before = bound_weights(Checkpoint(path), Q8_0, cache)
    write_checkpoint(path, LM, seed=1)  # the same path, other weights
    after = bound_weights(Checkpoint(path), Q8_0, cache)
    _assert_equal(after, _expected(path, "q8_0"))
    assert not np.array_equal(after["lm_head.weight"], before["lm_head.weight"])
    copy = shutil.copytree(path, tmp_path / "copy")
    _assert_equal(bound_weights(Checkpoint(copy), Q8_0, cache), after)  # the same content: its entry
    assert len(list((cache / "weights").iterdir())) == 2


def test_an_interrupted_conversion_leaves_no_file_and_a_damaged_one_is_converted_again(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path / "checkpoint", LM, seed=0)
    cache = tmp_path / "cache"
    calls, store = [], stored_weights.store

    def interrupted(*args):
        calls.append(args)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return store(*args)

    monkeypatch.setattr(stored_weights, "store", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bound_weights(Checkpoint(path), Q4_0, cache)
    assert list((cache / "weights").iterdir()) == []  # not even a partial file
    monkeypatch.setattr(stored_weights, "store", store)
    bound_weights(Checkpoint(path), Q4_0, cache)
    (file,) = (cache / "weights").iterdir()
    whole = file.stat().st_size
    file.write_bytes(file.read_bytes()[:-1000])  # as a writer that wrote in place and died would leave it
    _assert_equal(bound_weights(Checkpoint(path), Q4_0, cache), _expected(path, "q4_0"))
    assert file.stat().st_size == whole


def test_an_unwritable_cache_converts_in_memory_with_a_warning(tmp_path):
    path = write_checkpoint(tmp_path / "checkpoint", LM, seed=0)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.warns(UserWarning, match=f"cannot keep converted weights in {blocked}.*converting in memory"):
        bound = bound_weights(Checkpoint(path), Q4_0, blocked)
    _assert_equal(bound, _expected(path, "q4_0"))


def test_a_float32_gguf_is_bound_from_the_file_itself(tmp_path):
    """No conversion and no cache: every array is the file's own bytes, mapped."""
    from tests.gguf_files import write_gguf_file

    path = write_checkpoint(tmp_path / "checkpoint", LM, 0, "save_pretrained")
    gguf_path = write_gguf_file(path, LM, tmp_path / "lm.gguf", "F32")
    checkpoint = open_checkpoint(gguf_path)
    bound = bound_weights(checkpoint, FLOAT32, tmp_path / "cache")
    _assert_equal(bound, _expected(path, "float32"))
    assert not (tmp_path / "cache").exists()
    file_bytes = checkpoint.gguf.data("token_embd.weight")
    assert np.shares_memory(bound["transformer.wte.weight"], file_bytes)
