"""Every example runs to completion, so the examples never rot."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from max_gpt2.testing import write_checkpoint
from max_gpt2.verify import compare
from tests.support import GPT2_SMALL, run_python

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
}


def test_every_example_is_checked():
    assert [example.name for example in EXAMPLES] == sorted(EXPECTED)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_runs(compiled, example):
    compiled(GPT2_SMALL)  # the examples' graph is then in MAX's cache
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
