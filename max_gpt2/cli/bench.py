"""`max-gpt2 bench`: every attention implementation side by side (`max_gpt2.bench.attention`).

    max-gpt2 bench --models small --shapes 1x128,1x1024,8x256 --repeat 20 --no-cold-compile
    max-gpt2 bench --device gpu --dtype bfloat16

Results: `bench-results/bench-<device>-<dtype>.json` and `.png`, and a table on stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from max_gpt2.bench.attention import CPU_SHAPES, GPU_SHAPES, MODELS, parse_models, run_benchmark
from max_gpt2.bench.attention_report import format_table, plot
from max_gpt2.bench.report import publish
from max_gpt2.cli.console import positive_int, seed_value
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument(
        "--models", default="small,xl", help=f"from {', '.join(MODELS)}, or WIDTHxHEADS (default: small,xl)"
    )
    parser.add_argument(
        "--shapes", default=None, help=f"batch x seq list (default CPU: {CPU_SHAPES}; GPU: {GPU_SHAPES})"
    )
    parser.add_argument(
        "--impls", default=None, help="which contenders (default: all; on GPU all but numpy, a CPU baseline)"
    )
    parser.add_argument("--repeat", type=positive_int, default=10, help="timed rounds (default: 10)")
    parser.add_argument("--seed", type=seed_value, default=0)
    parser.add_argument("--output", type=Path, default=Path("bench-results"), help="folder for JSON and PNG")
    parser.add_argument(
        "--no-cold-compile",
        dest="cold_compile",
        action="store_false",
        help="skip timing a compile with an empty MAX cache (about a minute per implementation)",
    )


def main(args: argparse.Namespace, progress: Progress) -> int:
    args.models = parse_models(args.models)
    report = run_benchmark(args, progress)
    stem = args.output / f"bench-{report['device'].replace(':', '')}-{args.dtype}"
    publish(report, stem, format_table(report), plot)
    # A contender that could not run (out of memory) is reported, not a failure; a wrong answer is.
    return 0 if all(row.get("matches_reference", True) for row in report["results"]) else 1
