"""`max-gpt2 bench-startup`: start to first token and peak memory, ours beside llama.cpp's llama-completion.

    max-gpt2 bench-startup --llama-completion llama.cpp/build/bin/llama-completion --rounds 5
    max-gpt2 bench-startup --checkpoint ~/models/gpt2 --weight-format q8_0,q4_0 --threads 2

Whole processes, per weight format: ours from the checkpoint directory and from the GGUF file
`max-gpt2 convert` writes from it (once, into --output), and llama.cpp on that file, after a warm-up
run each, in interleaved rounds (`max_gpt2.bench.startup`). Without --checkpoint, the demo's
GPT-2-small-shaped checkpoint (random weights start as trained ones do). The table goes to stdout,
the figures to `bench-results/bench-startup.json`, with the CPU and the load average around the run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from max.driver import CPU

from max_gpt2.bench.harness import machine_description
from max_gpt2.bench.llama_cpp import check_binary
from max_gpt2.bench.report import publish
from max_gpt2.bench.startup import contenders, cpu_description, format_table, measure, ratios
from max_gpt2.cli.console import checkpoint_path, positive_int
from max_gpt2.model.formats import FORMATS, format_named
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (it takes no `--device` or `--dtype`: `max_gpt2.cli.HOST_ONLY`)."""
    parser.add_argument(
        "--checkpoint", type=Path, help="a GPT-2 checkpoint directory (default: the demo one)"
    )
    parser.add_argument(
        "--weight-format", default=",".join(FORMATS), help=f"comma-separated (default: {','.join(FORMATS)})"
    )
    parser.add_argument("--llama-completion", type=Path, help="a llama.cpp build's llama-completion")
    parser.add_argument(
        "--threads", type=positive_int, default=os.cpu_count() or 1, help="llama.cpp's threads"
    )
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds (default: 5)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the demo checkpoint is kept")
    parser.add_argument("--output", type=Path, default=Path("bench-results"), help="folder for GGUF and JSON")


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks the options, writes the GGUF files not written yet, times, publishes."""
    formats = list(
        dict.fromkeys(format_named(f.strip(), "--weight-format").name for f in args.weight_format.split(","))
    )
    llama = None if args.llama_completion is None else check_binary(args.llama_completion)
    checkpoint = checkpoint_path(args, progress)
    args.output.mkdir(parents=True, exist_ok=True)
    timed = []
    for weight_format in formats:
        gguf = args.output / f"{checkpoint.name}-{weight_format}.gguf"
        if not gguf.is_file():
            convert = [
                "convert",
                "--checkpoint",
                str(checkpoint),
                "--weight-format",
                weight_format,
                "--out",
                str(gguf),
            ]
            subprocess.run([sys.executable, "-m", "max_gpt2", *convert], check=True, env=dict(os.environ))
        timed += contenders(checkpoint, gguf, weight_format, llama, args.threads)
    before = os.getloadavg()[0]
    rows = measure(timed, args.rounds, progress)
    report = {
        "checkpoint": str(checkpoint),
        "machine": machine_description(CPU()),
        "lscpu": cpu_description(),
        "rounds": args.rounds,
        "threads": args.threads,
        "load": [before, os.getloadavg()[0]],
        "rows": rows,
        "ratios": ratios(rows),
    }
    publish(report, args.output / "bench-startup", format_table(report), lambda report, path: "none drawn")
    return 0
