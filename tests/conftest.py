"""Shared fixtures.

Compiling a new graph costs about 45 s on a 2-core machine, so every test gets
its compiled attention from one session-wide cache, keyed by (config, dtype,
device, impl), and binds its own weights with `with_weights` (milliseconds).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from max_gpt2 import CompiledAttention, GPT2Config, compile_attention
from max_gpt2.testing import random_attention_weights

Compiler = Callable[..., CompiledAttention]


@pytest.fixture(scope="session")
def compiled() -> Compiler:
    """`compiled(config, dtype="float32", device="cpu", impl="graph")`: a shared graph, seed-0 weights."""
    cache: dict[tuple[GPT2Config, str, str, str], CompiledAttention] = {}

    def get(
        config: GPT2Config, dtype: str = "float32", device: str = "cpu", impl: str = "graph"
    ) -> CompiledAttention:
        key = (config, dtype, device, impl)
        if key not in cache:
            cache[key] = compile_attention(config, random_attention_weights(config), device, dtype, impl)
        return cache[key]

    return get
