"""Example 3: GPT-2 attention on a GPU in bfloat16, checked against the float64 reference.

Stops cleanly, saying so, where MAX sees no accelerator.

    python examples/03_gpu_bfloat16.py
"""

from __future__ import annotations

import time

import numpy as np
from max.driver import Buffer, accelerator_count
from max.dtype import DType

from max_gpt2 import GPT2Config, compile_attention
from max_gpt2.model.formats.dtypes import float32_to_bfloat16_bits
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import check

if accelerator_count() == 0:
    print("MAX sees no accelerator here, so there is nothing to run: this example needs a GPU.")
    raise SystemExit(0)

config = GPT2Config()  # GPT-2 small
weights = random_attention_weights(config, seed=0)
start = time.perf_counter()
attention = compile_attention(config, weights, device="gpu", dtype="bfloat16")
seconds = time.perf_counter() - start
# impl "auto" picks the fused flash-attention kernel for bfloat16 on a GPU.
print(
    f"compiled GPT-2 small attention ({attention.impl}) for {attention.device.label} "
    f"in bfloat16 in {seconds:.1f} s"
)

x = np.random.default_rng(0).standard_normal((4, 512, config.n_embd)).astype(np.float32)
result = attention(x)  # NumPy float32 in; rounded to bfloat16 on the way in, widened on the way out
comparison = check(result, x, weights, config.n_head, "bfloat16")
print(
    f"relative error {comparison.relative_error:.1e} against the float64 reference "
    f"(bfloat16 tolerance {comparison.tolerance:.0e}): passed {comparison.passed}"
)

# Data that already lives on the GPU in bfloat16 skips every conversion: a tensor in, a tensor out.
x_gpu = Buffer.from_numpy(float32_to_bfloat16_bits(x)).view(DType.bfloat16).to(attention.device)
attention(x_gpu)  # warm-up
attention.device.synchronize()
start = time.perf_counter()
for _ in range(20):
    attention(x_gpu)
attention.device.synchronize()  # the GPU runs asynchronously; wait before reading the clock
print(f"on-device bfloat16 call, batch 4 x 512 tokens: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms")
raise SystemExit(0 if comparison.passed else 1)
