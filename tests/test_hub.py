"""Hub ids: resolved through huggingface_hub when it is installed, with a clear error when not."""

from __future__ import annotations

import sys
import types

import pytest

from max_gpt2.model import hub
from max_gpt2.testing import write_checkpoint
from tests.support import ODD


def test_local_path_wins(tmp_path):
    assert hub.resolve(tmp_path) == tmp_path


def test_hub_id_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(FileNotFoundError, match="install huggingface_hub"):
        hub.resolve("openai-community/gpt2")


def test_hub_id_downloads_weights_config_and_tokenizer_only(monkeypatch, tmp_path):
    calls = []

    def snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(write_checkpoint(tmp_path / "snapshot", ODD))

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download)
    )
    assert hub.resolve("openai-community/gpt2") == tmp_path / "snapshot"
    assert calls == [("openai-community/gpt2", ["*.safetensors", "*.json", "merges.txt"])]


def test_failed_download_is_a_clear_error(monkeypatch):
    def snapshot_download(repo_id, allow_patterns):
        raise ConnectionError("offline")

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download)
    )
    with pytest.raises(FileNotFoundError, match="fetching it from the Hugging Face Hub failed: offline"):
        hub.resolve("gpt2")


def test_paths_that_cannot_be_hub_ids_are_just_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file or directory: .*absent"):
        hub.resolve(tmp_path / "absent" / "model.safetensors")
