"""Every example runs to completion, so the examples never rot."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from max_gpt2.testing import write_checkpoint
from max_gpt2.verify import compare
from tests.support import GPT2_SMALL, LM, run_python

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))
EXPECTED = {
    "01_shapes.py": [
        "reduce.softmax",
        "-> [batch, 12, seq, seq]",
        "x [2, 5, 768] -> y [2, 5, 768]",
        "passed: True",
    ],
    "02_checkpoint.py": ["c_attn.weight  [2304, 768]", "layer 1: relative error"],
    "03_gpu_bfloat16.py": [],  # prints either the GPU result or that there is no GPU
    "04_generate.py": ["CompiledLM(n_layer=3", "agrees: True", "same in the padded batch: True"],
}


def test_every_example_is_checked():
    assert [example.name for example in EXAMPLES] == sorted(EXPECTED)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_runs(compiled, compiled_lm, example):
    # The graph each example compiles is then in MAX's cache.
    if example.name == "04_generate.py":
        compiled_lm(LM)
    else:
        compiled(GPT2_SMALL)
    done = run_python(example)
    assert done.returncode == 0, done.stdout + done.stderr
    for expected in EXPECTED[example.name]:
        assert expected in done.stdout


def test_readme_python_example_runs(compiled, tmp_path):
    compiled(GPT2_SMALL)
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    snippet = re.search(r"## Python API\n\n```python\n(.*?)```", readme, re.DOTALL).group(1)
    write_checkpoint(tmp_path, dataclasses.replace(GPT2_SMALL, n_layer=2, vocab_size=300))
    namespace: dict = {}
    exec(snippet.replace('"path/to/gpt2"', repr(str(tmp_path))), namespace)
    assert namespace["y"].shape == (2, 128, 768)
    assert compare(namespace["y"], namespace["expected"], "float32").passed


def test_readme_generation_example_runs(compiled_lm, lm_checkpoint, capsys):
    compiled_lm(LM)
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    snippet = re.search(r"## Generating text\n\n```python\n(.*?)```", readme, re.DOTALL).group(1)
    namespace: dict = {}
    exec(snippet.replace('"path/to/gpt2"', repr(str(lm_checkpoint(LM)))), namespace)
    lm, ids, batch, mask = (namespace[name] for name in ("lm", "ids", "batch", "mask"))
    assert namespace["logits"].shape == (1, ids.shape[1], LM.vocab_size)
    assert namespace["sampled"].shape == (1, ids.shape[1] + 20)
    assert namespace["out"].shape == (2, batch.shape[1] + 20)
    assert capsys.readouterr().out  # the streamed text
    assert mask[0, 0] == 0 and mask[:, -1].all()  # padded on the left
    greedy = lm.generate(ids, 20)[0, ids.shape[1] :]
    np.testing.assert_array_equal(np.concatenate(namespace["by_hand"]), greedy)  # the steps, by hand
    short = int(mask[0].sum())
    np.testing.assert_array_equal(namespace["out"][0, -short - 20 :], lm.generate(batch[:1, -short:], 20)[0])
