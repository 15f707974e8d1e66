"""What generation's controls and beam search cost, on a GPT-2-small-shaped model (random weights).

    python benchmarks/generation_controls.py --rounds 5 --new 64

1. The controls at batch 1: a greedy decoding step (`lm.stream`) with no control against the
   same with every control set (repetition, frequency and presence penalties, a 3-gram ban, a
   logit bias, min-new-tokens), interleaved rounds, median ms a step; and the host work alone
   (`Sampler.controlled` and the pick on `[1, 50257]` logits), which is what the controls add.
2. Beam search: `generate(num_beams=4)` against a batch of 4 greedy rows of the same prompt and
   length, steps per second, median of each round's ratio. The cache reorder runs on the device
   (`CompiledLM.reorder_cache`); the time of a full one (every position of three rows copied;
   beam search copies only the positions a row does not share with its parent) is reported too.

Target (issue 68): the controls add under 5 % to a batch-1 step; beams reach 85 % of the steps
per second of batch-4 greedy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from max_gpt2 import Sampler, compile_lm
from max_gpt2.inference.token_history import TokenHistory
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.parameters import model_parameter_shapes

CONTROLLED = Sampler(
    repetition_penalty=1.3,
    no_repeat_ngram_size=3,
    frequency_penalty=0.5,
    presence_penalty=0.3,
    logit_bias={50256: -100.0, 464: 2.0},
)


def step_ms(run, steps: int) -> float:
    """Milliseconds per step of `run()`, which yields `steps` steps (the first, the prefill, excluded)."""
    times = [time.perf_counter() for _ in run()]
    return (times[-1] - times[0]) / (steps - 1) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    config = GPT2Config()
    rng = np.random.default_rng(0)
    weights = {
        k: rng.normal(0, 0.02, s).astype(np.float32) for k, s in model_parameter_shapes(config).items()
    }
    started = time.perf_counter()
    lm = compile_lm(config, weights, "cpu")
    print(f"compiled in {time.perf_counter() - started:.0f} s")
    ids = rng.integers(0, config.vocab_size, (1, args.prompt))
    new = args.new

    plain, controlled, host, beams, greedy4, reorders = [], [], [], [], [], []
    history = TokenHistory(ids, np.ones_like(ids), config.vocab_size, CONTROLLED.no_repeat_ngram_size)
    logits = rng.standard_normal((1, config.vocab_size)).astype(np.float32)
    lm.generate(ids, 4, num_beams=4)  # compiles the reorder graph
    for _ in range(args.rounds):
        plain.append(step_ms(lambda: lm.stream(ids, new), new))
        controlled.append(
            step_ms(
                lambda: lm.stream(ids, new, sampler=CONTROLLED, eos_token_id=50256, min_new_tokens=new), new
            )
        )
        started = time.perf_counter()
        for _ in range(100):
            history.append(CONTROLLED(CONTROLLED.controlled(logits, history), None))
        host.append((time.perf_counter() - started) * 10)  # ms a step
        started = time.perf_counter()
        lm.generate(ids, new, num_beams=4)
        beams.append(new / (time.perf_counter() - started))
        started = time.perf_counter()
        lm.generate(np.repeat(ids, 4, axis=0), new)
        greedy4.append(new / (time.perf_counter() - started))
        cache = lm.new_cache(4, args.prompt + 1)
        lm.prefill(np.repeat(ids, 4, axis=0), cache)
        started = time.perf_counter()
        for step in range(20):
            lm.reorder_cache(cache, [1, 0, 0, 3] if step % 2 else [0, 0, 2, 2])
        reorders.append((time.perf_counter() - started) / 20 * 1e3)

    median = statistics.median
    print(f"batch 1, prompt {args.prompt}, {new} new tokens, {args.rounds} rounds (medians)")
    print(f"  greedy step                 {median(plain):7.2f} ms")
    print(f"  greedy step, every control  {median(controlled):7.2f} ms")
    share = median(host) / median(plain)
    print(f"  the controls' host work     {median(host):7.3f} ms a step ({share:.1%} of a step)")
    ratios = [b / g for b, g in zip(beams, greedy4, strict=True)]
    print(f"beam search, 4 beams         {median(beams):7.2f} steps/s")
    print(f"greedy, batch 4              {median(greedy4):7.2f} steps/s")
    print(f"  beams / batch 4            {median(ratios):7.1%}")
    print(f"  a full cache reorder, 4 rows at {args.prompt + 1} positions: {median(reorders):.2f} ms")


if __name__ == "__main__":
    main()
