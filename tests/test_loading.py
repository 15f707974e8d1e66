"""Starting quickly: compiled graphs kept on disk and read back without tracing, weights converted once
and memory-mapped after (`load_lm`, `max_gpt2.inference.artifacts`)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from max_gpt2 import load_lm
from max_gpt2.inference.artifacts import ArtifactCache
from max_gpt2.inference.lm_graphs import LMGraphs
from max_gpt2.inference.lm_options import LMOptions
from max_gpt2.inference.loading import compiled_with
from tests.support import LM, prompt_and_steps, prompts


class Notes:
    """A `LoadProgress` that keeps what it hears."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, message: str) -> None:
        self.lines.append(message)

    @contextlib.contextmanager
    def step(self, label: str):
        self.lines.append(label)
        yield


def test_compiled_graphs_are_kept_and_read_back_without_tracing(
    compiled_lm, lm_weights, tmp_path, monkeypatch
):
    options = LMOptions.check("cpu", "float32")
    first = LMGraphs(LM, options, tmp_path)
    variants = (first.prompt_variant, first.step_variant)
    assert not first.kept(*variants)
    first.compile(*variants)
    assert sorted(file.suffix for file in tmp_path.iterdir()) == [".json", ".mef"]
    second = LMGraphs(LM, options, tmp_path)
    assert second.kept(*variants)

    def refuse(variant):
        raise AssertionError(f"traced {variant}")

    monkeypatch.setattr(second, "_stage", refuse)
    lm = compiled_with(second, lm_weights(LM), variants)
    ids = prompts(LM, 2, 9)
    np.testing.assert_array_equal(prompt_and_steps(lm, ids, 5), prompt_and_steps(compiled_lm(LM), ids, 5))
    other = LMGraphs(LM, LMOptions.check("cpu", "float32", kv_cache="float16"), tmp_path)
    assert not other.kept(*variants)  # another KV cache is another graph


def test_an_unreadable_artifact_is_not_used(tmp_path):
    cache = ArtifactCache(tmp_path, {"model": "x"})
    assert cache.load(["plain"]) is None
    for file, text in zip(cache._files(["plain"]), ["not a MEF", '{"plain": "graph"}'], strict=True):
        file.write_text(text)
    assert cache.holds(["plain"]) and cache.load(["plain"]) is None


def test_the_second_load_neither_converts_nor_compiles(compiled_lm, lm_checkpoint, tmp_path):
    """`load_lm(DIR, weight_format="q4_0")` twice: the first converts the weights and keeps the graphs;
    the second maps the converted weights and reads the graphs compiled, with the same logits."""
    compiled_lm(LM, weights="q4_0")  # MAX's cache holds the graphs: the first load compiles in seconds
    path, notes = lm_checkpoint(LM), [Notes(), Notes()]
    lms = [load_lm(path, "cpu", weight_format="q4_0", progress=n, cache_dir=tmp_path) for n in notes]
    first, second = (" | ".join(n.lines) for n in notes)
    assert f"converting the weights of {path} to q4_0, once" in first and "compiling GPT-2 for cpu" in first
    assert "converting" not in second and "compiling" not in second, second
    assert "reading compiled GPT-2 for cpu float32, weights in q4_0, KV cache in float16" in second
    ids = prompts(LM, 1, 6)
    np.testing.assert_array_equal(lms[1].logits(ids), compiled_lm(LM, weights="q4_0").logits(ids))


def test_a_graph_first_needed_after_loading_compiles_as_a_step_of_the_loads_progress(
    compiled_lm, lm_checkpoint, tmp_path, monkeypatch
):
    """Scoring's graph, compiled when `logprobs` first asks for it (a minute or two), is reported as the
    load's own compile is: named, before it is traced."""
    compiled_lm(LM, weights="q4_0")  # MAX's cache holds the load's graphs
    notes = Notes()
    lm = load_lm(lm_checkpoint(LM), "cpu", weight_format="q4_0", progress=notes, cache_dir=tmp_path)
    heard = []

    def stage(variant):
        heard.append(notes.lines[-1])
        raise RuntimeError(f"{variant} not traced here")

    monkeypatch.setattr(lm.graph, "_stage", stage)
    with pytest.raises(RuntimeError, match="scores not traced here"):
        lm.logprobs(prompts(LM, 1, 6))
    assert heard == ["compiling the scores graph (a minute or two; kept compiled after)"]


def test_the_caches_live_under_cache_dir(lm_checkpoint, tmp_path):
    """Nothing is written outside `cache_dir`: weights under weights/ and digests/, graphs under graphs/."""
    load_lm(lm_checkpoint(LM), "cpu", weight_format="q4_0", cache_dir=tmp_path)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["digests", "graphs", "weights"]
