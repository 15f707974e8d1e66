"""Against Hugging Face's own GPT-2 and PyTorch (skipped unless `torch` and `transformers` are installed).

Hugging Face loads a checkpoint written by `write_checkpoint` (so our files are
in its layout), runs the whole model, and a hook captures one layer's attention
input and output; our compiled attention must give the same output for that input.
The benchmark's PyTorch contenders and `benchmarks/breakdown.py` run here too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from max_gpt2 import cli, load_attention_weights, reference
from max_gpt2.testing import write_checkpoint
from max_gpt2.verify import compare
from tests.support import GPT2_SMALL, ODD, layout_id, run_python

torch = pytest.importorskip("torch", reason="peer check needs torch (pip install -e '.[peers]')")
transformers = pytest.importorskip(
    "transformers", reason="peer check needs transformers (pip install -e '.[peers]')"
)


def hugging_face_attention(
    path, layer: int, seq_len: int, implementation: str
) -> tuple[np.ndarray, np.ndarray]:
    """Runs Hugging Face's GPT2Model on random tokens; returns `layer`'s attention input and output."""
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2Model.from_pretrained(path, attn_implementation=implementation).eval()
    seen = {}

    def capture(module, args, kwargs, output):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).numpy().copy()
        seen["y"] = output[0].numpy().copy()

    model.h[layer].attn.register_forward_hook(capture, with_kwargs=True)
    tokens = np.random.default_rng(layer).integers(0, model.config.vocab_size, (2, seq_len))
    with torch.no_grad():
        model(torch.from_numpy(tokens))
    return seen["x"], seen["y"]


@pytest.mark.parametrize("config", [ODD, GPT2_SMALL], ids=layout_id)
@pytest.mark.parametrize("layout", ["hub", "save_pretrained"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_matches_hugging_face(tmp_path, compiled, config, layout, implementation):
    two_layers = dataclasses.replace(config, n_layer=2, vocab_size=101)
    path = write_checkpoint(tmp_path, two_layers, seed=8, layout=layout)
    x, hf_output = hugging_face_attention(path, layer=1, seq_len=33, implementation=implementation)
    weights = load_attention_weights(path, 1)
    ours = compiled(config).with_weights(weights)(x)
    expected, largest_score = reference.attention_and_largest_score(x, weights, config.n_head)
    assert compare(hf_output, expected, "float32", largest_score).passed
    assert compare(ours, hf_output.astype(np.float64), "float32", largest_score).passed


def test_bench_times_pytorch_beside_ours(tmp_path, capsys):
    argv = ["bench", "--device", "cpu", "--models", f"{ODD.n_embd}x{ODD.n_head}", "--shapes", "2x9"]
    argv += ["--impls", "graph,torch-eager,torch-sdpa", "--repeat", "2", "--no-cold-compile"]
    assert cli.main([*argv, "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench-cpu-float32.json").read_text())
    rows = {row["impl"]: row for row in report["results"]}
    assert set(rows) == {"graph", "torch-eager", "torch-sdpa"} and not report["skipped"]
    assert all(row["matches_reference"] for row in rows.values())
    assert rows["torch-sdpa"]["speedup_vs_sdpa"] == 1.0 and rows["torch-eager"]["speedup_vs_eager"] == 1.0
    assert rows["graph"]["speedup_vs_sdpa"] == pytest.approx(
        rows["torch-sdpa"]["seconds"] / rows["graph"]["seconds"]
    )
    assert report["machine"]["torch"] == torch.__version__
    assert "| torch-sdpa |" in capsys.readouterr().out


def test_breakdown_script_splits_projections_from_the_core():
    done = run_python(
        Path(__file__).parent.parent / "benchmarks" / "breakdown.py", "--shape", "1x16", "--repeat", "1"
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split("|") for line in done.stdout.splitlines() if line.startswith("| ") and "ms" not in line
    ]
    assert [row[1].strip() for row in rows] == ["graph", "flash", "torch-sdpa", "torch-eager"]
    for row in rows:
        total, projections, core = (float(cell) for cell in row[2:5])
        assert core == pytest.approx(total - projections, abs=0.011)
