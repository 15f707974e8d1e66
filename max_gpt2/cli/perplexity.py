"""`max-gpt2 perplexity`: how well a checkpoint predicts text files, with Hugging Face's sliding window
or llama-perplexity's chunks.

    max-gpt2 perplexity --checkpoint ~/models/gpt2 wiki.test.txt
    max-gpt2 perplexity --checkpoint DIR a.txt b.txt --stride 1024 --json
    max-gpt2 perplexity --checkpoint DIR wiki.test.txt --chunks     # as llama-perplexity scores

For each file (UTF-8 text): the tokens scored, the mean negative log-likelihood
in nats, the perplexity (its exponential), bits per byte (the total in bits over
the bytes of the tokens scored), and the tokens run through the model per second
(every window's, context included: what llama-perplexity reports). Windows of
`n_positions` tokens every `--stride` tokens (default: half of `n_positions`), each
scoring only tokens no earlier window scored, or with `--chunks` side-by-side windows
each scoring its second half (`max_gpt2.inference.scoring`). Progress goes to
stderr, one line per tenth of a long file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from max_gpt2.cli.console import (
    CACHE_DIR_HELP,
    CHECKPOINT_HELP,
    adapters,
    add_lora_arguments,
    add_storage_arguments,
    checkpoint_path,
    open_with_tokenizer,
    positive_int,
    storage_options,
)
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.tokenizer import tokenizer_directory
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument("files", nargs="+", type=Path, help="UTF-8 text files to score")
    add_storage_arguments(parser)
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    add_lora_arguments(parser)
    windows = parser.add_mutually_exclusive_group()
    windows.add_argument(
        "--stride", type=positive_int, help="tokens between windows (default: n_positions / 2)"
    )
    windows.add_argument(
        "--chunks",
        action="store_true",
        help="side-by-side windows of n_positions tokens, each scoring its second half "
        "(llama-perplexity's way)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


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
    path = checkpoint_path(args, progress)
    checkpoint, tokenizer = open_with_tokenizer(path, adapters(args))
    if tokenizer is None:
        raise ValueError(f"{tokenizer_directory(checkpoint.path)} has no tokenizer to read the text with")
    window = checkpoint.config.n_positions
    if args.stride is not None and args.stride > window:
        raise ValueError(f"--stride {args.stride} is longer than the model's window, n_positions={window}")
    for file, text in texts.items():
        tokens = len(tokenizer.encode(text).ids)
        if tokens < 2:
            raise ValueError(f"{file} has fewer than 2 tokens: there is nothing to score")
        if args.chunks and tokens < window:
            raise ValueError(f"--chunks: {file} has {tokens} tokens, fewer than one window of {window}")
    lm = load_lm(checkpoint, args.device, args.dtype, progress=progress, **storage_options(args))
    results, seconds = {}, {}
    for file, text in texts.items():

        def report(done: int, total: int, file: Path = file) -> None:
            if total > 1 and (done == total or done % max(1, total // 10) == 0):
                progress.note(f"{file}: window {done} of {total}")

        started = time.perf_counter()
        results[file] = lm.perplexity(text, args.stride, tokenizer, report, chunks=args.chunks)
        seconds[file] = time.perf_counter() - started
    if args.json:
        rows = {
            str(file): {
                "tokens": result.tokens,
                "windows": result.windows,
                "nll": result.nll,
                "perplexity": result.perplexity,
                "bytes": result.bytes,
                "bits_per_byte": result.bits_per_byte,
                "tokens_run": result.tokens_run,
                "seconds": seconds[file],
            }
            for file, result in results.items()
        }
        plan = {"stride": args.stride, "chunks": args.chunks}
        print(json.dumps({"checkpoint": str(checkpoint.path), **plan, "files": rows}, indent=2))
        return 0
    print(
        f"{'file':<30}  {'tokens':>8}  {'windows':>7}  {'mean NLL':>9}  {'perplexity':>11}  {'bits/byte':>9}"
        f"  {'run tok/s':>9}"
    )
    for file, result in results.items():
        rate = result.tokens_run / seconds[file]
        print(
            f"{file!s:<30}  {result.tokens:>8}  {result.windows:>7}  {result.nll:>9.4f}  "
            f"{result.perplexity:>11.3f}  {result.bits_per_byte:>9.4f}  {rate:>9.1f}"
        )
    return 0
