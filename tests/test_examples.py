"""Every example and every Python block of the README and docs/ runs, so none of them rots.

A page's ```python blocks run in order in one namespace, as a reader would type them, with
`"path/to/gpt2"` replaced by the `LM` checkpoint (the suite's small model, with a tokenizer, whose
graphs the suite compiles anyway), `"path/to/text.txt"` by a file of the text we ship and
`"path/to/adapter"` by a LoRA adapter of LM's (`tests.test_lora.write_adapter`). A block
right after a line `<!-- doctest: skip, REASON -->` (it needs a server, a GPU or a peer) is
reported skipped with that reason. Each block is a test of its own; a test first runs the page's
earlier blocks that have not run yet, so `-k` can pick any one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from max_gpt2.testing import CORPUS
from tests.support import GPT2_SMALL, LM, run_python
from tests.test_lora import write_adapter

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
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

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:^<!-- doctest: skip, (?P<reason>[^\n]*?) -->\n)?^```python\n(?P<code>.*?)^```", re.M | re.S
)


class Block(NamedTuple):
    page: str  # relative to the repository
    index: int  # among the page's python blocks
    code: str
    skip: str | None  # the reason, for a block that cannot run here


def blocks(page: Path) -> list[Block]:
    name = str(page.relative_to(ROOT))
    return [
        Block(name, index, match["code"], match["reason"])
        for index, match in enumerate(BLOCK.finditer(page.read_text()))
    ]


BLOCKS = [block for page in PAGES for block in blocks(page)]


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


def test_the_readme_and_docs_have_python_blocks_and_well_formed_skips():
    pages = {block.page for block in BLOCKS}
    assert {"README.md", "docs/generation.md", "docs/scoring.md"} <= pages
    for page in PAGES:
        text = page.read_text()
        assert text.count("```python") == sum(block.page == str(page.relative_to(ROOT)) for block in BLOCKS)
        for marker in re.finditer(r"<!-- doctest:[^\n]*-->", text):
            assert re.match(r"<!-- doctest: skip, \S[^\n]* -->\n```python\n", text[marker.start() :]), (
                f"{page.name}: write '<!-- doctest: skip, REASON -->' on the line above ```python"
            )


def check_readme(ns: dict[str, Any]) -> None:
    assert ns["comparison"].passed and ns["y"].shape == ns["x"].shape
    ids = ns["ids"]
    assert ns["out"].shape == (1, ids.shape[1] + 20)
    assert ns["scores"].logprobs.shape == ids.shape and np.isnan(ns["scores"].logprobs[0, 0])
    assert np.isfinite(ns["result"].perplexity) and ns["result"].tokens > 0


def check_generation(ns: dict[str, Any]) -> None:
    lm, ids, batch, mask = (ns[name] for name in ("lm", "ids", "batch", "mask"))
    assert ns["logits"].shape == (1, ids.shape[1], LM.vocab_size)
    assert ns["sampled"].shape == (1, ids.shape[1] + 20)
    assert ns["three"].shape == (3, ids.shape[1] + 20) and ns["beams"].shape[0] == 2
    assert ns["eos"] not in ns["at_least_5"][0, ids.shape[1] :].tolist()  # banned by its bias
    assert mask[0, 0] == 0 and mask[:, -1].all()  # padded on the left
    greedy = lm.generate(ids, 20)[0, ids.shape[1] :]
    np.testing.assert_array_equal(np.concatenate(ns["by_hand"]), greedy)  # the steps, by hand
    for drafted in ("looked", "assisted"):  # speculative decoding: plain greedy's tokens
        np.testing.assert_array_equal(ns[drafted][0, ids.shape[1] :], greedy)
    short = int(mask[0].sum())
    np.testing.assert_array_equal(ns["out"][0, -short - 20 :], lm.generate(batch[:1, -short:], 20)[0])
    np.testing.assert_allclose(ns["other"].logits(ids), lm.logits(ids), rtol=1e-6, atol=1e-6)  # rebound
    new = ids.shape[1]
    assert json.loads(lm.tokenizer.decode(ns["as_json"][0, new:].tolist()))["answer"] in ("yes", "no")
    assert lm.tokenizer.decode(ns["picked"][0, new:].tolist()) in ("red", "green")
    assert re.fullmatch("[0-9]{1,3}", lm.tokenizer.decode(ns["mixed"][0, new:].tolist()))
    np.testing.assert_array_equal(ns["mixed"][1], lm.generate(ids, 20, eos_token_id=ns["eos"])[0])  # free


def check_correctness(ns: dict[str, Any]) -> None:
    assert ns["result"].passed


# What a page's blocks must have left behind, checked after its last block.
CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "README.md": check_readme,
    "docs/generation.md": check_generation,
    "docs/correctness.md": check_correctness,
}


class Page:
    """One page's namespace, and how many of its blocks have run in it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.namespace: dict[str, Any] = {}
        self.done = 0


@pytest.fixture(scope="module")
def doc_pages(tmp_path_factory, lm_checkpoint) -> dict[str, Any]:
    """Each page's state, and the placeholders' replacements."""
    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text(CORPUS.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    adapter = write_adapter(tmp_path_factory.mktemp("adapter") / "adapter", LM)
    replacements = {
        '"path/to/gpt2"': repr(str(lm_checkpoint(LM))),
        '"path/to/text.txt"': repr(str(text)),
        '"path/to/adapter"': repr(str(adapter)),
    }
    pages = {name: Page(tmp_path_factory.mktemp("page")) for name in {block.page for block in BLOCKS}}
    return {"pages": pages, "replacements": replacements}


def run(block: Block, page: Page, replacements: dict[str, str]) -> None:
    code = block.code
    for placeholder, value in replacements.items():
        code = code.replace(placeholder, value)
    exec(compile(code, f"{block.page}, python block {block.index}", "exec"), page.namespace)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: f"{block.page}-{block.index}")
def test_doc_block_runs(block, doc_pages, compiled_lm, monkeypatch):
    compiled_lm(LM)  # the graphs the blocks load, compiled (or found in MAX's cache) once for the suite
    page = doc_pages["pages"][block.page]
    monkeypatch.chdir(page.directory)  # whatever a block writes lands in a scratch folder
    earlier = [b for b in BLOCKS if b.page == block.page and page.done <= b.index < block.index]
    for before in earlier:
        if before.skip is None:
            run(before, page, doc_pages["replacements"])
        page.done = before.index + 1
    if block.skip is not None:
        page.done = max(page.done, block.index + 1)
        pytest.skip(f"{block.page}, python block {block.index}: {block.skip}")
    if page.done <= block.index:
        run(block, page, doc_pages["replacements"])
        page.done = block.index + 1
    last = max(b.index for b in BLOCKS if b.page == block.page and b.skip is None)
    if block.index == last and block.page in CHECKS:
        CHECKS[block.page](page.namespace)
