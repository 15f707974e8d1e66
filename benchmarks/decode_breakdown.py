"""Where a decoding step's time goes: per layer and the rest, step graph (Mojo kernels) against MAX's ops.

    python benchmarks/decode_breakdown.py            # GPT-2 small shapes, CPU, float32

Times one decoding step (one new token per row, median of 20) of GPT-2 small
shapes with 12 layers and with 1, at several context lengths and batch 1 and 8,
through the step graph (`"decode"`, the Mojo kernels) and the prompt graph
(`"plain"`, MAX's own ops) on the same weights and caches. A layer costs
(t12 - t1) / 11; the rest (embeddings, final norm, LM head, the call itself)
costs t1 minus one layer. Each layer reads 28.3 MB of float32 weights and the
head 154 MB, so bytes over time gives the bandwidth each part streams at.
Compiling the 1-layer model's graphs takes a minute or two the first time.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from max_gpt2.config import GPT2Config
from max_gpt2.console import default_cache_dir
from max_gpt2.inputs import position_ids
from max_gpt2.lm import CompiledLM, load_lm
from max_gpt2.testing import write_checkpoint

CONTEXTS = (32, 160, 512, 900)
BATCHES = (1, 8)


def step_ms(lm: CompiledLM, variant: str, batch: int, context: int, rng: np.random.Generator) -> float:
    """Median ms of a decoding step at `context` positions, after a prompt of that length."""
    ids = rng.integers(0, lm.config.vocab_size, (batch, context))
    mask = np.ones_like(ids)
    caches = lm._new_cache(batch, context + 1)
    lm._run(ids, position_ids(mask), mask, np.array([context - 1]), caches)
    token, position = np.full((batch, 1), 5), np.full((batch, 1), context)
    mask = np.ones((batch, context + 1), dtype=np.int64)
    times = []
    for _ in range(20):  # the same position each time: the step rewrites it
        start = time.perf_counter()
        lm._run(token, position, mask, np.array([0]), caches, variant)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    timings: dict[int, dict[tuple[str, int, int], float]] = {}
    for layers in (12, 1):
        path = default_cache_dir() / f"gpt2-small-{layers}-layer-breakdown"
        if not (path / "config.json").is_file():
            write_checkpoint(path, GPT2Config(n_layer=layers), seed=0)
        lm, rng = load_lm(path, "cpu", "float32"), np.random.default_rng(0)
        timings[layers] = {
            (variant, batch, context): step_ms(lm, variant, batch, context, rng)
            for variant in ("decode", "plain")
            for batch in BATCHES
            for context in CONTEXTS
        }
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
