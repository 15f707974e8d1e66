"""`max-gpt2 demo`: the attention of every layer of a checkpoint against the reference, as a table.

    max-gpt2 demo                                   # the seeded GPT-2-small-shaped checkpoint
    max-gpt2 demo --checkpoint ~/models/gpt2-xl --device gpu --dtype bfloat16 --layers 0-5

The same check as `max-gpt2 verify` (`max_gpt2.cli.verify`), introduced by a
line saying what it shows, and always printed as a table.
"""

from __future__ import annotations

import argparse

from max_gpt2.cli import verify
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`verify`'s options, but for `--json`."""
    verify.add_arguments(parser)
    parser.set_defaults(json=False)


def main(args: argparse.Namespace, progress: Progress) -> int:
    progress.note(
        "max-gpt2 demo: GPT-2 attention compiled with MAX, checked layer by layer "
        "against an independent NumPy reference"
    )
    return verify.main(args, progress)
