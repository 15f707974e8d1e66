"""`max-gpt2 verify`: every chosen layer of a checkpoint's attention against the NumPy reference.

    max-gpt2 verify --checkpoint ~/models/gpt2 --json --batch 4 --seq-len 512

Loads the checkpoint through the weights adapter, compiles attention once, runs
every chosen layer on the same random batch and compares each with the float64
reference under `max_gpt2.verify`'s tolerances. With no `--checkpoint` it makes
(once) and reuses a seeded GPT-2-small-shaped checkpoint in the cache directory.
Progress goes to stderr, the report to stdout (a table, or JSON with `--json`);
the exit status is 1 if any layer disagrees with the reference, 2 for bad input.
`max-gpt2 demo` is the same check with a banner (`max_gpt2.cli.demo`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from max_gpt2.cli.console import demo_checkpoint, parse_layers, positive_int, seed_value
from max_gpt2.inference.attention import IMPLEMENTATIONS, compile_attention
from max_gpt2.inference.devices import device_name, resolve_device
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.outputs import Progress, default_cache_dir
from max_gpt2.verify import check, precision


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check's options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument("--checkpoint", help="GPT-2 safetensors checkpoint: file, directory, or Hub id")
    parser.add_argument("--impl", default="auto", choices=IMPLEMENTATIONS, help="(default: auto)")
    parser.add_argument("--batch", type=positive_int, default=2)
    parser.add_argument("--seq-len", type=positive_int, default=128)
    parser.add_argument("--layers", default="all", help="'all' or a list such as '0,3-5' (default: all)")
    parser.add_argument(
        "--seed", type=seed_value, default=0, help="seed for the input and the demo checkpoint"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the demo checkpoint is kept")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Runs the check and prints the report; 0 if every layer agrees, 1 if one does not, 2 for bad input."""
    args.cache_dir = args.cache_dir or default_cache_dir()
    report = run_verification(args, progress)
    print(json.dumps(report, indent=2) if getattr(args, "json", False) else format_report(report))
    return 0 if report["passed"] else 1


def check_memory(batch: int, n_head: int, seq_len: int) -> None:
    """Refuses, before compiling, a shape whose float64 reference scores [batch, n_head, seq, seq] alone
    are more than the machine's memory."""
    needed = batch * n_head * seq_len**2 * 8
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory:
        raise ValueError(
            f"--batch {batch} --seq-len {seq_len}: the float64 reference's attention scores "
            f"[{batch}, {n_head}, {seq_len}, {seq_len}] alone take {needed / 1e9:.1f} GB, and this machine "
            f"has {memory / 1e9:.1f} GB"
        )


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
    check_memory(args.batch, config.n_head, args.seq_len)
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
        comparison = check(result, x, weights, config.n_head, precision(args.dtype, not device.is_host))
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
