"""`max-gpt2 generate`: text (or token ids) in, generated text streamed out as it comes.

    max-gpt2 generate --checkpoint ~/models/gpt2 --prompt "The cat sat" --max-new-tokens 40
    max-gpt2 generate --checkpoint DIR --tokens 464,3290      # ids, where there is no tokenizer
    echo "Once upon a time" | max-gpt2 generate --prompt-file - --repetition-penalty 1.3 --stop "."
    max-gpt2 generate --prompt "The cat" --num-beams 4 --num-return-sequences 2
    max-gpt2 generate --prompt-file notes.txt --prompt-lookup 10   # drafts looked up in the prompt
    max-gpt2 generate --checkpoint BIG --draft SMALL --prompt "The cat"  # drafts from a smaller model

Without `--checkpoint` it uses the seeded GPT-2-small-shaped demo checkpoint (its
tokenizer is trained on a few paragraphs we ship and its weights are random, so
expect gibberish, and ids the small tokenizer does not know, shown as `[id]`).
Greedy by default; `--temperature`, `--top-k`, `--top-p`, `--min-p` or `--seed` switch
to sampling. The logits controls (`--repetition-penalty` and the rest, `Sampler`'s
names) apply either way. One sequence streams to stdout, the text flushed token by
token and cut before a `--stop` string; several (`--num-return-sequences`,
`--num-beams`) are printed each after a `[sequence N]` line once all are done.
Progress, prefill time and decode tokens/s go to stderr. Stops early at the
config's `eos_token_id` (any of them, where it lists several).

`--prompt-lookup K` and `--draft CHECKPOINT` (`--draft-tokens K`) decode speculatively
(`max_gpt2.inference.drafting`): the same text, greedy or sampled, in fewer passes
over the weights where the drafts are right; the drafted and accepted counts go to stderr.
The draft checkpoint is loaded with the same device, dtype and storage options.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.cli.console import (
    add_prompt_arguments,
    add_storage_arguments,
    open_prompt,
    positive_int,
    storage_options,
)
from max_gpt2.inference.generation_options import OVERFLOWS, check_options
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.prompts import check_prompt
from max_gpt2.inference.sampling import Sampler
from max_gpt2.inference.stop_strings import StopTextStream, cut
from max_gpt2.inference.tokenizer import TextStream
from max_gpt2.outputs import Progress

SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")
CONTROLS = ("repetition_penalty", "no_repeat_ngram_size", "frequency_penalty", "presence_penalty")


def bias_entry(text: str) -> tuple[int, float]:
    """argparse type: `ID=VALUE`, such as `50256=-100`."""
    id_, _, value = text.partition("=")
    try:
        return int(id_), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be ID=VALUE such as 50256=-100; got {text!r}") from None


def early_stopping(text: str) -> bool | str:
    """argparse type: `true`, `false` or `never`."""
    choices: dict[str, bool | str] = {"true": True, "false": False, "never": "never"}
    if text not in choices:
        raise argparse.ArgumentTypeError(f"must be true, false or never; got {text!r}")
    return choices[text]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    add_prompt_arguments(parser, "to continue")
    add_storage_arguments(parser)
    option = parser.add_argument
    option("--max-new-tokens", type=positive_int, default=32, help="(default: 32)")
    option("--temperature", type=float, help="sample, dividing the logits by this first")
    option("--top-k", type=positive_int, help="sample among the k most likely tokens")
    option("--top-p", type=float, help="sample among the most likely tokens holding this mass")
    option("--min-p", type=float, help="sample among tokens at least this times as likely as the top one")
    option("--seed", type=int, help="sample, with this seed (same seed, same text)")
    option("--repetition-penalty", type=float, default=1.0, help="Hugging Face's, over prompt and output")
    option("--no-repeat-ngram-size", type=int, default=0, help="never repeat an n-gram of this size")
    option("--frequency-penalty", type=float, default=0.0, help="OpenAI's, -2 to 2, over the output")
    option("--presence-penalty", type=float, default=0.0, help="OpenAI's, -2 to 2, over the output")
    option(
        "--logit-bias", type=bias_entry, action="append", help="ID=VALUE added to a token's logit; repeats"
    )
    option("--min-new-tokens", type=int, default=0, help="no end-of-text before this many tokens")
    option("--stop", action="append", help="end the text before this string; repeats")
    option("--num-return-sequences", type=positive_int, default=1, help="sequences to generate (default: 1)")
    option("--num-beams", type=positive_int, default=1, help="beam search with this many beams (default: 1)")
    option("--length-penalty", type=float, default=1.0, help="beam search's exponent of the length")
    option("--early-stopping", type=early_stopping, default=False, help="beam search's: true, false, never")
    option("--context-overflow", choices=OVERFLOWS, default="error", help="shift: go on past n_positions")
    option(
        "--prompt-lookup", type=positive_int, metavar="K", help="draft up to K tokens from the text so far"
    )
    option("--draft", metavar="CHECKPOINT", help="draft with this smaller model (the same tokenizer)")
    option("--draft-tokens", type=positive_int, metavar="K", help="with --draft: tokens a draft (default: 8)")


def sampler_of(args: argparse.Namespace) -> Sampler:
    """The `Sampler` the options ask for: sampling where any sampling option is given; `--temperature 0`
    is greedy, as llama.cpp's and the server's."""
    sampling = {name: getattr(args, name) for name in SAMPLING if getattr(args, name) is not None}
    flags = ", ".join("--" + name.replace("_", "-") for name in sampling)
    if sampling.get("temperature") == 0:
        if len(sampling) > 1:
            raise ValueError(f"--temperature 0 is greedy decoding: leave out the sampling flags ({flags})")
        sampling = {}
    if sampling and args.num_beams > 1:
        raise ValueError(f"--num-beams searches the likeliest sequences without sampling: leave out {flags}")
    controls = {name: getattr(args, name) for name in CONTROLS}
    bias = dict(args.logit_bias) if args.logit_bias else None
    return Sampler(do_sample=bool(sampling), **sampling, **controls, logit_bias=bias)


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks everything, compiles, then generates: streamed for one sequence, printed after for several."""
    checkpoint, tokenizer, prompt = open_prompt(args, progress)
    config = checkpoint.config
    # Everything a user typed is checked before reading the weights and compiling.
    new_tokens = 0 if args.context_overflow == "shift" else args.max_new_tokens
    ids, _ = check_prompt(config, np.array([prompt], dtype=np.int64), None, new_tokens)
    if args.stop and tokenizer is None:
        raise ValueError("--stop needs the checkpoint's tokenizer, to spell the text")
    options: dict[str, Any] = {
        "sampler": sampler_of(args),
        "eos_token_id": config.stop_token_ids,
        "min_new_tokens": args.min_new_tokens,
        "stop_strings": args.stop,
        "tokenizer": tokenizer,
        "pad_token_id": None if config.stop_token_ids else 0,  # fills a sequence that stops first
        "num_return_sequences": args.num_return_sequences,
        "context_overflow": args.context_overflow,
        "num_beams": args.num_beams,
        "length_penalty": args.length_penalty,  # without beams, a warning that it changes nothing
        "early_stopping": args.early_stopping,
    }
    several = args.num_beams > 1 or args.num_return_sequences > 1
    if args.prompt_lookup is not None and args.draft is not None:
        raise ValueError("give --prompt-lookup or --draft, not both")
    if args.draft_tokens is not None and args.draft is None:
        raise ValueError("--draft-tokens sizes the drafts of --draft CHECKPOINT: give that too")
    if args.prompt_lookup is not None:
        options["prompt_lookup_num_tokens"] = args.prompt_lookup
    check_options(config, args.max_new_tokens, **options)
    if args.draft is not None:  # checked with the model it drafts for, once loaded
        draft = load_lm(args.draft, args.device, args.dtype, progress=progress, **storage_options(args))
        options |= {"assistant_model": draft}
        if args.draft_tokens is not None:  # else the library's default
            options["num_assistant_tokens"] = args.draft_tokens
    lm = load_lm(checkpoint, args.device, args.dtype, progress=progress, **storage_options(args))
    if several:
        start = time.perf_counter()
        rows = lm.generate(ids, args.max_new_tokens, **options)
        seconds = time.perf_counter() - start
        for number, row in enumerate(rows, 1):
            print(f"[sequence {number}]")
            print(shown(row[: len(prompt)], row[len(prompt) :], tokenizer, args.stop or ()))
        progress.note(
            f"{len(rows)} sequences of up to {rows.shape[1] - len(prompt)} new tokens in {seconds:.3f} s"
        )
        return 0
    steps = lm.stream(ids, args.max_new_tokens, **options)
    print(shown(np.array(prompt), np.array([], dtype=np.int64), tokenizer, ()), end="", flush=True)
    text: TextStream | None = None
    if tokenizer is not None:  # the new tokens' text, from the first
        text = StopTextStream(tokenizer, args.stop) if args.stop else TextStream(tokenizer)
    start, times = time.perf_counter(), []
    for step in steps:
        times.append(time.perf_counter())
        token = step.tokens[0]
        print(text(token) if text is not None else f",{token}", end="", flush=True)
    print(text.flush() if text is not None else "")
    report_speed(progress, len(prompt), times, start)
    if "prompt_lookup_num_tokens" in options or "assistant_model" in options:
        drafts = steps.drafts
        share = f" ({drafts.accepted / drafts.drafted:.0%})" if drafts.drafted else ""
        progress.note(f"drafts: {drafts.drafted} tokens drafted, {drafts.accepted} accepted{share}")
    return 0


def shown(prompt: np.ndarray, new: np.ndarray, tokenizer: Tokenizer | None, stops: Sequence[str]) -> str:
    """A sequence as printed: the prompt's text and the new text cut before a stop string, or the ids
    comma-separated where there is no tokenizer."""
    if tokenizer is None:
        return ",".join(str(int(id_)) for id_ in [*prompt, *new])
    prompt_text = tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
    return prompt_text + cut(tokenizer.decode(new.tolist(), skip_special_tokens=False), stops)


def report_speed(progress: Progress, prompt_len: int, times: list[float], start: float) -> None:
    """Prefill (prompt to first token) and decode rate (every later token), on stderr."""
    progress.note(f"prefill: {prompt_len} prompt tokens in {(times[0] - start) * 1e3:.1f} ms")
    if len(times) > 1:
        decoded, seconds = len(times) - 1, times[-1] - times[0]
        progress.note(f"decode: {decoded} tokens in {seconds:.3f} s, {decoded / seconds:.1f} tokens/s")
