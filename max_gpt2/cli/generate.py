"""`max-gpt2 generate`: text (or token ids) in, generated text streamed out as it comes.

    max-gpt2 generate --checkpoint ~/models/gpt2 --prompt "The cat sat" --max-new-tokens 40
    max-gpt2 generate --checkpoint DIR --tokens 464,3290      # ids, where there is no tokenizer

Without `--checkpoint` it uses the seeded GPT-2-small-shaped demo checkpoint (its
tokenizer is trained on a few paragraphs we ship and its weights are random, so
expect gibberish, and ids the small tokenizer does not know, shown as `[id]`).
Greedy by default; `--temperature`, `--top-k`, `--top-p` or `--seed` switch to
sampling. The prompt and the new text go to stdout, the text flushed token by
token; progress, prefill time and decode tokens/s go to stderr.
Stops early at the config's `eos_token_id` (any of them, where it lists several).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from max_gpt2.cli.console import (
    add_prompt_arguments,
    add_storage_arguments,
    open_prompt,
    positive_int,
    storage_options,
)
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.prompts import check_prompt
from max_gpt2.inference.sampling import Sampler
from max_gpt2.inference.tokenizer import TextStream
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    add_prompt_arguments(parser, "to continue")
    add_storage_arguments(parser)
    parser.add_argument("--max-new-tokens", type=positive_int, default=32, help="(default: 32)")
    parser.add_argument("--temperature", type=float, help="sample, dividing the logits by this first")
    parser.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="sample among the most likely tokens holding this mass")
    parser.add_argument("--seed", type=int, help="sample, with this seed (same seed, same text)")


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks everything, compiles, then streams the generation."""
    checkpoint, tokenizer, prompt = open_prompt(args, progress)
    config = checkpoint.config
    # Everything a user typed is checked before reading the weights and compiling.
    ids, _ = check_prompt(config, np.array([prompt], dtype=np.int64), None, args.max_new_tokens)
    do_sample = any(value is not None for value in (args.temperature, args.top_k, args.top_p, args.seed))
    temperature = 1.0 if args.temperature is None else args.temperature
    sampler = Sampler(do_sample, temperature, args.top_k, args.top_p, args.seed)

    lm = load_lm(checkpoint, args.device, args.dtype, progress=progress, **storage_options(args))

    steps = lm.stream(ids, args.max_new_tokens, sampler=sampler, eos_token_id=config.stop_token_ids)
    if tokenizer is not None:
        text = TextStream(tokenizer)
        print("".join(text(token) for token in prompt), end="", flush=True)
    else:
        print(",".join(map(str, prompt)), end="", flush=True)
    start, times = time.perf_counter(), []
    for step in steps:
        times.append(time.perf_counter())
        token = step.tokens[0]
        print(text(token) if tokenizer is not None else f",{token}", end="", flush=True)
    print(text.flush() if tokenizer is not None else "")
    report_speed(progress, len(prompt), times, start)
    return 0


def report_speed(progress: Progress, prompt_len: int, times: list[float], start: float) -> None:
    """Prefill (prompt to first token) and decode rate (every later token), on stderr."""
    progress.note(f"prefill: {prompt_len} prompt tokens in {(times[0] - start) * 1e3:.1f} ms")
    if len(times) > 1:
        decoded, seconds = len(times) - 1, times[-1] - times[0]
        progress.note(f"decode: {decoded} tokens in {seconds:.3f} s, {decoded / seconds:.1f} tokens/s")
