"""What a constraint's mask adds to a decoding step, beside the same step unconstrained, in one run.

    python benchmarks/constraint_cost.py --checkpoint DIR --formats float32,q4_0 --batches 1,16

DIR: GPT-2 small's shapes with GPT-2's own tokenizer (50,257 tokens; the server's demo checkpoint
or one written with `max_gpt2.testing.write_checkpoint` and GPT-2's vocab.json and merges.txt).
Each round runs `lm.stream` greedy for `--new` steps, free, then held to `IN_A_STRING` (a JSON
object's string value that never closes: the state JSON output spends most of its tokens in, with
most of the vocabulary allowed, held for every step of every row), alternately; per format and
batch, the median of the rounds' ratios of milliseconds a step (constrained over free) and the
host work alone (the engine's bitmask, the mask and the matchers' step on `[batch, 50257]`
logits). A JSON schema's `minLength` or `maxLength` in the thousands makes the engine's step
itself slow (its repetition is expanded): a constraint's cost depends on its grammar.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from max_gpt2 import Constraint, load_lm
from max_gpt2.bench.harness import machine_description
from max_gpt2.inference.constraints import GrammarEngine
from max_gpt2.inference.devices import resolve_device

IN_A_STRING = Constraint.grammar('root ::= "{\\"text\\": \\"" [^"\\\\]*')


def step_ms(steps) -> float:
    """Milliseconds a step of the iterator `steps`, its first (the prefill) left out."""
    times = [time.perf_counter() for _ in steps]
    return (times[-1] - times[0]) / (len(times) - 1) * 1e3


def host_ms(engine: GrammarEngine, batch: int, steps: int) -> float:
    """Milliseconds a step of the guide alone: the mask of `[batch, V]` logits and the matchers' step."""
    guide = engine.guide([IN_A_STRING] * batch)
    logits = np.random.default_rng(0).standard_normal((batch, engine.vocab_size)).astype(np.float32)
    finished = np.zeros(batch, dtype=bool)
    started = time.perf_counter()
    for _ in range(steps):
        tokens = np.argmax(guide.mask(logits, finished), axis=-1)
        guide.accept(tokens, finished)
    return (time.perf_counter() - started) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--formats", default="float32,q4_0")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--new", type=int, default=48)
    args = parser.parse_args()
    print(machine_description(resolve_device("cpu")), flush=True)
    for weight_format in args.formats.split(","):
        lm = load_lm(args.checkpoint, "cpu", weight_format=weight_format)
        assert lm.tokenizer is not None, f"{args.checkpoint} has no tokenizer"
        eos = lm.tokenizer.token_to_id("<|endoftext|>")
        engine = GrammarEngine(lm.tokenizer, lm.config.vocab_size, [eos])
        for batch in (int(b) for b in args.batches.split(",")):
            ids = np.random.default_rng(batch).integers(0, 50000, (batch, 32))
            ratios, free_ms = [], []
            for _ in range(args.rounds):
                free = step_ms(lm.stream(ids, args.new))
                held = step_ms(lm.stream(ids, args.new, constraint=IN_A_STRING, eos_token_id=eos))
                ratios.append(held / free)
                free_ms.append(free)
            print(
                f"{weight_format} batch {batch}: constrained/free {statistics.median(ratios):.3f} "
                f"(rounds {min(ratios):.3f}-{max(ratios):.3f}), "
                f"free {statistics.median(free_ms):.1f} ms a step, "
                f"the guide alone {host_ms(engine, batch, args.new):.2f} ms a step",
                flush=True,
            )


if __name__ == "__main__":
    main()
