"""The `max-gpt2` command: one module per subcommand, each with `add_arguments` and `main`.

    demo, verify     a checkpoint's attention, layer by layer, against the reference
    generate         text (or ids) in, a generation streamed out
    score            each token's log-probability, and the likeliest alternatives
    perplexity       text files' perplexity and bits per byte, sliding window
    heads            what every attention head looks at: heatmaps and a summary
    serve            our GPT-2 behind MAX's OpenAI-compatible server
    bench            the attention implementations side by side
    bench-generate   text generation against Hugging Face
    convert          a checkpoint to a GGUF file in one of our weight formats

Progress goes to stderr, results to stdout. The exit status is 0 on success, 1
when a check fails, 2 for bad input (checked before anything compiles).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from max_gpt2.cli import (
    bench,
    bench_generate,
    convert,
    demo,
    generate,
    heads,
    perplexity,
    score,
    serve,
    verify,
)
from max_gpt2.model.dtypes import DTYPES
from max_gpt2.outputs import Progress

COMMANDS = {
    "demo": demo,
    "verify": verify,
    "generate": generate,
    "score": score,
    "perplexity": perplexity,
    "heads": heads,
    "serve": serve,
    "bench": bench,
    "bench-generate": bench_generate,
    "convert": convert,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="max-gpt2", description="GPT-2 on MAX, checked against NumPy")
    commands = parser.add_subparsers(dest="command", required=True)
    target = argparse.ArgumentParser(add_help=False)  # every command's device and dtype
    target.add_argument("--device", default="auto", help="auto, cpu, gpu or gpu:N (default: auto)")
    target.add_argument("--dtype", default="float32", choices=list(DTYPES))
    for name, command in COMMANDS.items():
        help_line = (command.__doc__ or "").split("\n")[0].split(": ", 1)[-1]
        command.add_arguments(commands.add_parser(name, parents=[target], help=help_line))
    return parser


# What bad input raises, before any long work: reported in one line, with exit status 2.
BAD_INPUT = (OSError, ValueError, TypeError, ImportError)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].main(args, Progress(sys.stderr))
    except BAD_INPUT as error:
        print(f"max-gpt2 {args.command}: error: {error}", file=sys.stderr)
        return 2
