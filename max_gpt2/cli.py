"""Command line: `max-gpt2 demo`, `verify`, `bench`, `bench-generate`, `generate`, `heads` and `serve`.

`demo` and `verify` load a GPT-2 checkpoint through the weights adapter, compile attention once,
run every chosen layer on the same random batch, and compare each with the NumPy
reference. With no `--checkpoint`, they make (once) and reuse a seeded
GPT-2-small-shaped checkpoint in the cache directory. Progress goes to stderr,
results to stdout; the exit status is 1 if any layer disagrees with the
reference, 2 for bad input. `bench` is `max_gpt2.bench`, `bench-generate` `max_gpt2.bench_generate`,
`generate` `max_gpt2.generation`, `heads` `max_gpt2.heads`, `serve` `max_gpt2.server`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from max_gpt2 import bench, bench_generate, generation, heads, server
from max_gpt2.console import Progress, default_cache_dir, demo_checkpoint, parse_layers, positive_int
from max_gpt2.devices import device_name, resolve_device
from max_gpt2.dtypes import DTYPES
from max_gpt2.runtime import IMPLEMENTATIONS, compile_attention
from max_gpt2.verify import check
from max_gpt2.weights import Checkpoint


def run_verification(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Loads, compiles, runs and compares every chosen layer; returns the report."""
    device = resolve_device(args.device)
    if args.checkpoint is None:
        path = demo_checkpoint(args.cache_dir, args.seed, progress)
    else:
        path = args.checkpoint
    with progress.step(f"opening {path}") as opening:
        checkpoint = Checkpoint(path)
    config = checkpoint.config
    layers = parse_layers(args.layers, config.n_layer)
    progress.note(
        f"GPT-2 with n_embd={config.n_embd}, n_head={config.n_head}, n_layer={config.n_layer}; "
        f"checking {len(layers)} of its {config.n_layer} layers"
    )
    load_seconds = opening["seconds"]
    with progress.step(f"reading layer {layers[0]}") as loading:
        first_weights = checkpoint.attention_weights(layers[0])
    load_seconds += loading["seconds"]
    progress.note("(a new graph takes about a minute to compile; MAX caches it, so reruns take seconds)")
    with progress.step(f"compiling attention for {device_name(device)} {args.dtype}") as compiling:
        attention = compile_attention(config, first_weights, device, args.dtype, args.impl)

    shape = (args.batch, args.seq_len, config.n_embd)
    x = np.random.default_rng(args.seed).standard_normal(shape, dtype=np.float32)
    rows, run_seconds, reference_seconds = [], 0.0, 0.0
    for layer in layers:
        start = time.perf_counter()
        weights = checkpoint.attention_weights(layer)
        bound = attention.with_weights(weights)  # the compiled graph, this layer's weights
        load_seconds += time.perf_counter() - start
        start = time.perf_counter()
        result = bound(x)
        run_seconds += time.perf_counter() - start
        start = time.perf_counter()
        comparison = check(result, x, weights, config.n_head, args.dtype)
        reference_seconds += time.perf_counter() - start
        rows.append({"layer": layer, **dataclasses.asdict(comparison), "passed": comparison.passed})
        progress.note(f"layer {layer}: relative error {comparison.relative_error:.2e}")
    return {
        "checkpoint": str(checkpoint.path),
        "config": config.to_dict(),
        "device": device_name(device),
        "dtype": args.dtype,
        "impl": attention.impl,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "seconds": {
            "load": load_seconds,
            "compile": compiling["seconds"],
            "run": run_seconds,
            "reference": reference_seconds,
        },
        "layers": rows,
        "passed": all(row["passed"] for row in rows),
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as a readable table, with where the time went."""
    seconds = report["seconds"]
    count = len(report["layers"])
    lines = [
        f"checkpoint {report['checkpoint']}",
        f"device {report['device']}, dtype {report['dtype']}, impl {report['impl']}, "
        f"input [{report['batch']}, {report['seq_len']}, {report['config']['n_embd']}]; errors are "
        f"relative to the output's largest magnitude (tolerances: max_gpt2/verify.py)",
        "",
        "layer  max abs error  relative error  max |score|  tolerance  pass",
    ]
    for row in report["layers"]:
        lines.append(
            f"{row['layer']:>5}  {row['max_abs_error']:>13.3e}  {row['relative_error']:>14.3e}  "
            f"{row['largest_score']:>11.1f}  {row['tolerance']:>9.1e}  {'yes' if row['passed'] else 'NO'}"
        )
    lines += [
        "",
        f"time: load {seconds['load']:.2f} s, compile {seconds['compile']:.2f} s (once, for all layers), "
        f"run {seconds['run'] * 1e3 / count:.2f} ms per layer on MAX, "
        f"reference {seconds['reference'] * 1e3 / count:.2f} ms per layer on NumPy",
        "all layers agree with the reference"
        if report["passed"]
        else "MISMATCH: some layers disagree with the reference",
    ]
    return "\n".join(lines)


# Commands that live in a module of their own, with its `add_arguments` and `main`.
COMMANDS = {"bench-generate": bench_generate, "generate": generation, "heads": heads, "serve": server}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="max-gpt2", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    target = argparse.ArgumentParser(add_help=False)  # every command's device and dtype
    target.add_argument("--device", default="auto", help="auto, cpu, gpu or gpu:N (default: auto)")
    target.add_argument("--dtype", default="float32", choices=list(DTYPES))
    shared = argparse.ArgumentParser(add_help=False, parents=[target])
    shared.add_argument("--checkpoint", help="GPT-2 safetensors checkpoint: file, directory, or Hub id")
    shared.add_argument("--impl", default="auto", choices=IMPLEMENTATIONS, help="(default: auto)")
    shared.add_argument("--batch", type=positive_int, default=2)
    shared.add_argument("--seq-len", type=positive_int, default=128)
    shared.add_argument("--layers", default="all", help="'all' or a list such as '0,3-5' (default: all)")
    shared.add_argument("--seed", type=int, default=0, help="seed for the input and the demo checkpoint")
    shared.add_argument("--cache-dir", type=Path, default=None, help="where the demo checkpoint is kept")
    commands.add_parser("demo", parents=[shared], help="check every layer of a checkpoint, as a table")
    verify = commands.add_parser("verify", parents=[shared], help="the same check, for scripts")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.add_arguments(commands.add_parser("bench", parents=[target], help=bench.__doc__.split("\n")[0]))
    for name, command in COMMANDS.items():
        command.add_arguments(
            commands.add_parser(name, parents=[target], help=command.__doc__.split("\n")[0])
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return bench.main(args, Progress(sys.stderr))
    if args.command in COMMANDS:
        return COMMANDS[args.command].main(args, Progress(sys.stderr))
    args.cache_dir = args.cache_dir or default_cache_dir()
    as_json = getattr(args, "json", False)
    progress = Progress(sys.stderr)
    if args.command == "demo":
        progress.note(
            "max-gpt2 demo: GPT-2 attention compiled with MAX, checked layer by layer "
            "against an independent NumPy reference"
        )
    try:
        report = run_verification(args, progress)
    except (OSError, ValueError) as error:
        print(f"max-gpt2: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return 0 if report["passed"] else 1
