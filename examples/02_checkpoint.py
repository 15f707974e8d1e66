"""Example 2: load attention weights from a GPT-2 safetensors checkpoint and check them.

With a path (a checkpoint directory, `.safetensors` file, or Hub id) it uses
that checkpoint; without one it writes a small seeded checkpoint with GPT-2
small's attention shapes (two layers, a tiny vocabulary) to a temporary folder.

    python examples/02_checkpoint.py [CHECKPOINT]
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from max_gpt2 import Checkpoint, GPT2Config, compile_attention
from max_gpt2.testing import write_checkpoint
from max_gpt2.verify import check, precision

with tempfile.TemporaryDirectory() as scratch:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        path = write_checkpoint(scratch, GPT2Config(n_layer=2, vocab_size=256), seed=0)
        print(f"wrote a seeded two-layer checkpoint to {path}")

    checkpoint = Checkpoint(path)  # checks the files and reads config.json
    config = checkpoint.config
    print(f"{checkpoint.path}: n_embd={config.n_embd}, n_head={config.n_head}, n_layer={config.n_layer}")
    stored = checkpoint.adapter.key_of("transformer.h.0.attn.c_attn.weight")  # the checkpoint's own name
    print(f"key layout: {stored} (Conv1D [in, out], transposed on load)")

    weights = checkpoint.attention_weights(0)
    for name, value in weights.items():
        print(f"  {name:<14} {list(value.shape)} float32")

    start = time.perf_counter()
    attention = compile_attention(config, weights, device="auto")
    print(f"compiled for {attention.device.label} in {time.perf_counter() - start:.1f} s")

    tolerance = precision("float32", not attention.device.is_host)  # TF32 matmuls on a GPU
    x = np.random.default_rng(0).standard_normal((1, 16, config.n_embd)).astype(np.float32)
    passed = True
    for layer in range(config.n_layer):
        layer_weights = checkpoint.attention_weights(layer)
        result = attention.with_weights(layer_weights)(x)  # same graph, this layer's weights
        comparison = check(result, x, layer_weights, config.n_head, tolerance)
        print(f"layer {layer}: relative error {comparison.relative_error:.1e}, passed: {comparison.passed}")
        passed &= comparison.passed

raise SystemExit(0 if passed else 1)
