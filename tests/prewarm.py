"""Compiles graphs that later test files need, in a second process, while the first files run.

A MAX compile keeps about one of this machine's two cores busy for one to two
minutes, and MAX caches what it compiles on disk (`~/.cache/modular`).
`tests/conftest.py` starts this module beside a full test run, while
test_attention.py compiles its own graphs, so that by the time the benchmark, CLI
and language-model tests ask for these they load from the cache in seconds.
Nothing here is checked: a graph this process has not finished in time is simply
compiled again by the test that needs it.

    python -m tests.prewarm
"""

from __future__ import annotations

import numpy as np

from max_gpt2 import compile_attention, compile_lm
from max_gpt2.testing import random_attention_weights
from max_gpt2.weights import model_parameter_shapes
from tests.support import LM, LM_ONE_LAYER, ODD


def main() -> None:
    for impl in ("wrapper", "flash"):  # tests/test_bench.py, test_impls.py
        compile_attention(ODD, random_attention_weights(ODD), "cpu", "float32", impl)
    for config in (LM, LM_ONE_LAYER):  # tests/test_cli.py, test_examples.py, test_lm.py
        weights = {
            name: np.zeros(shape, np.float32) for name, shape in model_parameter_shapes(config).items()
        }
        compile_lm(config, weights, "cpu")


if __name__ == "__main__":
    main()
