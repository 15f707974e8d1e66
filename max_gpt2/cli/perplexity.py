"""`max-gpt2 perplexity`: how well a checkpoint predicts text files, with Hugging Face's sliding window.

    max-gpt2 perplexity --checkpoint ~/models/gpt2 wiki.test.txt
    max-gpt2 perplexity --checkpoint DIR a.txt b.txt --stride 1024 --json

For each file (UTF-8 text): the tokens scored, the mean negative log-likelihood
in nats, the perplexity (its exponential) and bits per byte (the total in bits
over the bytes of the tokens scored). Windows of `n_positions` tokens every
`--stride` tokens (default: half of `n_positions`), each scoring only tokens no
earlier window scored (`max_gpt2.inference.scoring`). Progress goes to stderr,
one line per tenth of a long file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from max_gpt2.cli.console import (
    CHECKPOINT_HELP,
    add_storage_arguments,
    demo_checkpoint,
    open_with_tokenizer,
    positive_int,
    storage_options,
)
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.tokenizer import tokenizer_directory
from max_gpt2.outputs import Progress, default_cache_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument("files", nargs="+", type=Path, help="UTF-8 text files to score")
    add_storage_arguments(parser)
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "--stride", type=positive_int, help="tokens between windows (default: n_positions / 2)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the demo checkpoint is kept")


def read_texts(files: list[Path]) -> dict[Path, str]:
    """Each file's text, or a ValueError naming the file that is missing or not UTF-8."""
    texts = {}
    for file in files:
        try:
            texts[file] = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{file} is not UTF-8 text: {error}") from None
    return texts


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Reads every file and checks the stride first, then compiles and scores each file."""
    texts = read_texts(args.files)
    path = args.checkpoint or demo_checkpoint(args.cache_dir or default_cache_dir(), 0, progress)
    checkpoint, tokenizer = open_with_tokenizer(path)
    if tokenizer is None:
        raise ValueError(f"{tokenizer_directory(checkpoint.path)} has no tokenizer to read the text with")
    window = checkpoint.config.n_positions
    if args.stride is not None and args.stride > window:
        raise ValueError(f"--stride {args.stride} is longer than the model's window, n_positions={window}")
    for file, text in texts.items():
        if len(tokenizer.encode(text).ids) < 2:
            raise ValueError(f"{file} has fewer than 2 tokens: there is nothing to score")
    lm = load_lm(checkpoint, args.device, args.dtype, progress=progress, **storage_options(args))
    results = {}
    for file, text in texts.items():

        def report(done: int, total: int, file: Path = file) -> None:
            if total > 1 and (done == total or done % max(1, total // 10) == 0):
                progress.note(f"{file}: window {done} of {total}")

        results[file] = lm.perplexity(text, args.stride, tokenizer, report)
    if args.json:
        rows = {
            str(file): {
                "tokens": result.tokens,
                "windows": result.windows,
                "nll": result.nll,
                "perplexity": result.perplexity,
                "bytes": result.bytes,
                "bits_per_byte": result.bits_per_byte,
            }
            for file, result in results.items()
        }
        print(
            json.dumps({"checkpoint": str(checkpoint.path), "stride": args.stride, "files": rows}, indent=2)
        )
        return 0
    print(
        f"{'file':<30}  {'tokens':>8}  {'windows':>7}  {'mean NLL':>9}  {'perplexity':>11}  {'bits/byte':>9}"
    )
    for file, result in results.items():
        print(
            f"{file!s:<30}  {result.tokens:>8}  {result.windows:>7}  {result.nll:>9.4f}  "
            f"{result.perplexity:>11.3f}  {result.bits_per_byte:>9.4f}"
        )
    return 0
