"""Where a decoding step's time goes: per layer and the rest, step graph (Mojo kernels) against MAX's ops.

    python benchmarks/decode_breakdown.py            # GPT-2 small shapes, CPU, float32

Times one decoding step (one new token per row, median of 20) of GPT-2 small
shapes with 12 layers and with 1, at several context lengths and batch 1 and 8,
through the Mojo kernels (`"decode"`, the default step graph on the CPU) and
through MAX's own ops (`"plain"`, `load_lm(..., kernels=False)`), on the same
weights, with `CompiledLM`'s public steps (`new_cache`, `prefill`, `decode_step`). A layer costs
(t12 - t1) / 11; the rest (embeddings, final norm, LM head, the call itself)
costs t1 minus one layer. Each layer reads 28.3 MB of float32 weights and the
head 154 MB, so bytes over time gives the bandwidth each part streams at.
Compiling the 1-layer model's graphs takes a minute or two the first time.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from max_gpt2.inference.lm import CompiledLM, load_lm
from max_gpt2.model.config import GPT2Config
from max_gpt2.outputs import default_cache_dir
from max_gpt2.testing import write_checkpoint

CONTEXTS = (32, 160, 512, 900)
STEPS = 20
BATCHES = (1, 8)


def step_ms(lm: CompiledLM, batch: int, context: int, rng: np.random.Generator) -> float:
    """Median ms of a decoding step at about `context` positions, after a prompt of that length."""
    ids = rng.integers(0, lm.config.vocab_size, (batch, context))
    cache = lm.new_cache(batch, context + STEPS)
    lm.prefill(ids, cache)
    tokens, times = np.full(batch, 5), []
    for _ in range(STEPS):  # the context grows by one a step: by STEPS in all, next to hundreds
        start = time.perf_counter()
        lm.decode_step(tokens, cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    timings: dict[int, dict[tuple[str, int, int], float]] = {}
    for layers in (12, 1):
        path = default_cache_dir() / f"gpt2-small-{layers}-layer-breakdown"
        if not (path / "config.json").is_file():
            write_checkpoint(path, GPT2Config(n_layer=layers), seed=0)
        rng = np.random.default_rng(0)
        timings[layers] = {}
        for variant, kernels in (("decode", None), ("plain", False)):
            lm = load_lm(path, "cpu", "float32", kernels=kernels)
            for batch in BATCHES:
                for context in CONTEXTS:
                    timings[layers][variant, batch, context] = step_ms(lm, batch, context, rng)
    print("| graph | batch | context | step ms | per layer ms | rest ms | layer GB/s | rest GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key in timings[12]:
        whole, one = timings[12][key], timings[1][key]
        layer = (whole - one) / 11
        rest = one - layer
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {whole:.1f} | {layer:.2f} | {rest:.1f} "
            f"| {28.3 / layer:.0f} | {154.4 / rest:.0f} |"
        )


if __name__ == "__main__":
    main()
