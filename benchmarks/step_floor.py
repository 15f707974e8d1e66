"""Where a batch-1 decoding step's time goes beyond streaming its weights, per weight format.

    python benchmarks/step_floor.py [--weights float32,bfloat16,q8_0,q4_0] [--rounds 3]

For each format, in alternated rounds: the median batch-1 `decode_step` after a
32-token prompt (`decode_breakdown.step_ms`) of GPT-2 small's
shapes (the bench checkpoint) and of a model with the same ops at width 64
(12 layers, one head, vocabulary 320: a step that reads almost no bytes, so its
time is what the ops cost to run at all: MAX's runtime, our kernels' set-up,
the host). Beside them, the time the small step's weights take at the measured
bandwidth (`bench-generate`'s limit, `max_gpt2.bench.bandwidth`). What is left,

    rest = step - floor - weight bytes / bandwidth,

is what the products lose to the bandwidth limit plus what runs only at full width
(layer norms, GELU, attention, handing products to the second thread). CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
from decode_breakdown import step_ms  # this folder's; run as `python benchmarks/step_floor.py`

from max_gpt2.bench.bandwidth import host_bandwidth, weight_bytes_per_step
from max_gpt2.bench.generation import MODELS, demo_checkpoint_for
from max_gpt2.bench.harness import machine_description
from max_gpt2.inference.devices import resolve_device
from max_gpt2.inference.lm import load_lm
from max_gpt2.model.config import GPT2Config
from max_gpt2.outputs import Progress, default_cache_dir
from max_gpt2.testing import write_checkpoint

SAME_OPS = GPT2Config(n_embd=64, n_head=1, n_layer=12, n_positions=256, vocab_size=320)
PROMPT = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="float32,bfloat16,q8_0,q4_0")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    progress = Progress(sys.stderr)
    small = demo_checkpoint_for("small", default_cache_dir(), progress)
    tiny = default_cache_dir() / "gpt2-same-ops-width-64"
    if not (tiny / "config.json").is_file():
        write_checkpoint(tiny, SAME_OPS, seed=0)
    formats = args.weights.split(",")
    models = {}
    for weights in formats:
        with progress.step(f"loading both models with {weights} weights"):
            models[weights] = (load_lm(small, "cpu", weights=weights), load_lm(tiny, "cpu", weights=weights))
    bandwidth = max(host_bandwidth().values())
    times: dict[str, tuple[list[float], list[float]]] = {weights: ([], []) for weights in formats}
    rng = np.random.default_rng(0)
    for _ in range(args.rounds):
        for weights, (full, floor) in models.items():
            times[weights][0].append(step_ms(full, 1, PROMPT, rng))
            times[weights][1].append(step_ms(floor, 1, PROMPT, rng))
    print(machine_description(resolve_device("cpu")), f"bandwidth {bandwidth / 1e9:.1f} GB/s")
    print("| weights | step ms | same ops at width 64 ms | weights at bandwidth ms | rest ms |")
    print("|---|---:|---:|---:|---:|")
    for weights, (full, floor) in times.items():
        step, base = statistics.median(full), statistics.median(floor)
        streaming = weight_bytes_per_step(MODELS["small"], weights) / bandwidth * 1e3
        print(f"| {weights} | {step:.2f} | {base:.2f} | {streaming:.2f} | {step - base - streaming:.2f} |")


if __name__ == "__main__":
    main()
