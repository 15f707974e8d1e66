"""Example 1: build GPT-2 attention on random weights and follow a tensor's shape through it.

MAX traces `GPT2Attention.forward` into a graph whose batch and sequence
dimensions stay symbolic (`batch`, `seq`). This script prints every operation
of that graph with the shape it produces, then compiles the graph, runs it on
a concrete batch, and checks the result against the NumPy reference.

    python examples/01_shapes.py
"""

from __future__ import annotations

import re

import numpy as np
from max.driver import CPU
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import TensorType, default_device, default_dtype

from max_gpt2 import GPT2Attention, GPT2Config, compile_attention
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import check

config = GPT2Config()  # GPT-2 small: n_embd 768, 12 heads of 64
print(f"GPT-2 small attention: n_embd={config.n_embd}, n_head={config.n_head}, head_dim={config.head_dim}")

# F.lazy() defers the module's random initial weights: they are never materialized.
with F.lazy(), default_device(CPU()), default_dtype(DType.float32):
    module = GPT2Attention(config)
print(f"parameters: {', '.join(f'{name} {list(map(int, p.shape))}' for name, p in module.parameters)}")

graph = str(module.trace(TensorType(DType.float32, ("batch", "seq", config.n_embd), device=CPU())).graph)
print("\nthe traced graph, one line per operation (constants left out):")
operation = re.compile(r"= (?:rmo\.)?(?:mo\.)?([\w.]+)[(\[ ].*-> \(?(.*)$")
for line in graph.splitlines():
    found = operation.search(line)
    if found and not found.group(1).startswith(("constant", "chain")):
        shapes = re.findall(r"tensor<\[(.*?)\]", found.group(2))
        print(f"  {found.group(1):<18} -> {'  '.join(f'[{shape}]' for shape in shapes)}")

weights = random_attention_weights(config, seed=0)
attention = compile_attention(config, weights, device="cpu")
x = np.random.default_rng(0).standard_normal((2, 5, config.n_embd)).astype(np.float32)
y = attention(x)
print(f"\nran it with batch=2, seq=5: x {list(x.shape)} -> y {list(y.shape)}")
comparison = check(y, x, weights, config.n_head, "float32")
print(f"relative error against the NumPy reference: {comparison.relative_error:.1e}")
print(f"passed: {comparison.passed}")
raise SystemExit(0 if comparison.passed else 1)
