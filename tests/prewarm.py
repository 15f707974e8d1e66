"""Compiles the CPU graphs the test suite uses, in a second process, last-used first.

MAX compiles a graph on little more than one core, and a fresh machine spends
most of `make test` compiling. `conftest.py` starts this module when the session
starts: it fills MAX's cache (`~/.cache/modular`) from the end of the suite while
the tests compile from the start, so on 2 cores each graph is compiled about
once and the two streams meet in the middle. Where a graph is already cached this
costs seconds. Weights are zeros: they are bound after compiling, never compiled in.

Keep GRAPHS in step with the fixtures' keys (`conftest.py`); a graph missing here
is only compiled later, by the test that needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from max_gpt2 import GPT2Config, compile_attention, compile_lm
from max_gpt2.inference.lm_graphs import LMGraphs
from max_gpt2.model.layers.variants import REORDER
from max_gpt2.model.parameters import model_parameter_shapes, parameter_shapes
from tests.support import GPT2_SMALL, LM, LM_ONE_LAYER, LM_ONE_LAYER_GGUF, ODD, serving_missing


def zeros(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    return {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}


def attention(config: GPT2Config, dtype: str = "float32", impl: str = "graph") -> None:
    compile_attention(config, zeros(parameter_shapes(config)), "cpu", dtype, impl)


def attention_weights(config: GPT2Config) -> None:
    compiled = compile_attention(config, zeros(parameter_shapes(config)), "cpu")
    compiled.attentions(np.zeros((1, 2, config.n_embd), np.float32))


def lm(
    config: GPT2Config,
    output_attentions: bool = False,
    weights: str = "float32",
    kv_cache: str | None = None,
    variant: Callable[[LMGraphs], Any] | None = None,
) -> None:
    """The language model's graphs for generation (or its attentions variant), and `variant(graphs)` after
    them."""
    parameters = zeros(model_parameter_shapes(config))
    compiled = compile_lm(
        config,
        parameters,
        "cpu",
        output_attentions=output_attentions,
        weight_format=weights,
        kv_cache=kv_cache,
    )
    if variant is not None:
        compiled.graph.compile(variant(compiled.graph))


# In the order the suite first needs them (test files run alphabetically): test_attention,
# test_bench (ODD graph and flash), test_bench_generate (LM, and with q8_0 weights), test_embeddings
# (both's hidden states), test_examples (LM's scoring graphs), test_generation_controls (LM's beam
# search cache reorder), test_gguf_types (LM_ONE_LAYER as a GGUF file has it), test_heads,
# test_lm, test_runtime, test_serve_weights (LM in q4_0 beside a float32 cache, and its scoring
# graph), test_weight_formats.
GRAPHS: list[Callable[[], None]] = [
    lambda: attention(GPT2_SMALL),
    lambda: attention(ODD),
    lambda: attention(ODD, impl="flash"),
    lambda: lm(LM),
    lambda: lm(LM, weights="q8_0"),
    lambda: lm(LM, variant=lambda graphs: graphs.hidden),
    lambda: lm(LM, weights="q8_0", variant=lambda graphs: graphs.hidden),
    lambda: lm(LM, variant=LMGraphs.scoring),
    lambda: lm(LM, variant=lambda graphs: graphs.scoring(ranked=True)),
    lambda: lm(LM, variant=lambda graphs: REORDER),
    lambda: lm(LM_ONE_LAYER_GGUF),
    lambda: attention_weights(ODD),
    lambda: lm(LM, output_attentions=True),
    lambda: lm(LM_ONE_LAYER),
    lambda: attention(ODD, "bfloat16"),
    lambda: lm(LM, weights="q4_0", kv_cache="float32", variant=LMGraphs.scoring),
    *(
        lambda w=weights: lm(LM_ONE_LAYER, weights=w, kv_cache="float32")
        for weights in ("bfloat16", "q8_0", "q4_0")
    ),
]
if not serving_missing():
    from tests.test_serve_offline import compile_positions

    GRAPHS.append(compile_positions)

if __name__ == "__main__":
    for compile_graph in reversed(GRAPHS):
        compile_graph()
