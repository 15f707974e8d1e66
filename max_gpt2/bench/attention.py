"""Every attention implementation side by side: what `max-gpt2 bench` runs.

Contenders, all given the same weights and the same input at each shape:
`graph`, `flash` and `wrapper` (ours, compiled with MAX), `numpy` (the float64
reference) and, when PyTorch is installed, `torch-eager` (scores, mask,
softmax) and `torch-sdpa` (`scaled_dot_product_attention`, causal). Rounds are
interleaved, each round timing every contender in a rotating order (one call, or
a burst of up to 10 for calls under 50 ms), so machine noise falls on all of
them alike; the table reports medians. Before its timed call a contender runs
untimed for at least `harness.SETTLE_SECONDS`: right after a switch, the previous
runtime's worker threads (MAX's, PyTorch's OpenMP, NumPy's BLAS) are still
spinning on the same cores. Each output is checked against the reference on its
first `CHECKED_TOKENS` positions (all of them, up to 1024 tokens). How each
contender is called: `max_gpt2.bench.attention_contenders`.

FLOPs count the useful work: the two projections, and QK^T and PV over the
S(S+1)/2 query-key pairs the causal mask keeps. Peak is a large matrix
multiply measured in the same run: NumPy float32 on CPU, PyTorch in the compute
dtype on GPU. Peak memory is the host RSS a call adds (CPU, Linux); MAX reports
no device allocations, so on GPU it is left out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from max.driver import Device

from max_gpt2 import reference
from max_gpt2.bench.attention_contenders import (
    CONTENDERS,
    MAX_CONTENDERS,
    Contender,
    max_contenders,
    numpy_contender,
    torch_contenders,
)
from max_gpt2.bench.harness import (
    cold_compile_seconds,
    in_turn,
    machine_description,
    measure_peak_gflops,
    peak_dtype,
    peak_extra_memory_mib,
    settle,
    torch_skip_reason,
)
from max_gpt2.inference.devices import device_name, resolve_device
from max_gpt2.model.config import GPT2Config
from max_gpt2.outputs import Progress
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import compare, precision

MODELS = {
    "small": GPT2Config(n_embd=768, n_head=12),
    "medium": GPT2Config(n_embd=1024, n_head=16),
    "large": GPT2Config(n_embd=1280, n_head=20),
    "xl": GPT2Config(n_embd=1600, n_head=25),
}
BURST_SECONDS, MAX_BURST = 0.05, 10
CHECKED_TOKENS = 1024  # rows of each output compared with the reference
CPU_SHAPES = "1x128,1x256,1x512,1x1024,8x256"
GPU_SHAPES = "1x128,1x1024,1x4096,1x16384,8x256"


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    """`"1x128,8x256"` -> [(1, 128), (8, 256)]."""
    shapes = []
    for item in spec.split(","):
        batch, sep, seq = item.strip().partition("x")
        if not (sep and batch.isdigit() and seq.isdigit() and int(batch) > 0 and int(seq) > 0):
            raise ValueError(f"--shapes wants a list such as '1x128,8x256' (batch x seq); got {item!r}")
        shapes.append((int(batch), int(seq)))
    return shapes


def parse_models(spec: str) -> dict[str, GPT2Config]:
    """`"small,xl"` or widths x heads such as `"768x12,60x5"` -> {name: config}."""
    models = {}
    for item in (part.strip() for part in spec.split(",")):
        width, sep, heads = item.partition("x")
        if item in MODELS:
            models[item] = MODELS[item]
        elif sep and width.isdigit() and heads.isdigit():
            models[item] = GPT2Config(n_embd=int(width), n_head=int(heads))  # checks the split
        else:
            raise ValueError(f"--models takes names from {', '.join(MODELS)} or WIDTHxHEADS; got {item!r}")
    return models


def parse_choice(spec: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    """A comma-separated subset of `allowed`, in the order given."""
    chosen = [item.strip() for item in spec.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in allowed]
    if unknown or not chosen:
        raise ValueError(f"{flag} takes a list from {', '.join(allowed)}; got {spec!r}")
    return list(dict.fromkeys(chosen))


def attention_flops(config: GPT2Config, batch: int, seq_len: int) -> float:
    """Multiply-adds x 2 for the projections and the unmasked part of QK^T and PV."""
    width = config.n_embd
    projections = 2 * batch * seq_len * width * (3 * width + width)
    pairs = seq_len * (seq_len + 1) / 2
    return projections + 2 * 2 * batch * config.n_head * config.head_dim * pairs


def time_shape(
    contenders: list[Contender], x: np.ndarray, expected: np.ndarray, args: argparse.Namespace, device: Device
) -> dict[str, dict[str, Any]]:
    """Warms each contender up (checking its output), then times interleaved rounds."""
    results: dict[str, dict[str, Any]] = {}
    live = []
    for contender in contenders:
        prepared = contender.prepare(x)
        try:
            output = contender.finish(contender.call(prepared))
        except Exception as error:  # out of memory, most often: recorded, the others go on
            results[contender.name] = {"error": f"{type(error).__name__}: {error}"[:300]}
            continue
        comparison = compare(
            output[:, : expected.shape[1]], expected, precision(args.dtype, not device.is_host)
        )
        results[contender.name] = {"matches_reference": comparison.passed}
        live.append((contender, prepared))
    times: dict[str, list[float]] = {contender.name: [] for contender, _ in live}
    for round_index in range(args.repeat):
        for contender, prepared in in_turn(live, round_index):
            last = settle(contender.call, prepared)
            # Short calls are timed in bursts, for as many samples as the long ones get time.
            for _ in range(min(MAX_BURST, max(1, int(BURST_SECONDS / last)))):
                start = time.perf_counter()
                contender.call(prepared)
                times[contender.name].append(time.perf_counter() - start)
    for contender, prepared in live:
        results[contender.name]["seconds"] = statistics.median(times[contender.name])
        results[contender.name]["min_seconds"] = min(times[contender.name])
        results[contender.name]["samples"] = len(times[contender.name])
        results[contender.name]["peak_extra_mib"] = peak_extra_memory_mib(
            lambda c=contender, p=prepared: c.call(p), device
        )
    return results


def run_benchmark(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Compiles, checks and times every contender at every model and shape; returns the report."""
    device = resolve_device(args.device)
    shapes = parse_shapes(args.shapes or (CPU_SHAPES if device.is_host else GPU_SHAPES))
    everyone = CONTENDERS if device.is_host else tuple(name for name in CONTENDERS if name != "numpy")
    args.impls = parse_choice(args.impls or ",".join(everyone), CONTENDERS, "--impls")
    skipped: dict[str, str] = {}
    torch_reason = torch_skip_reason(device)
    if torch_reason:
        skipped.update({name: torch_reason for name in ("torch-eager", "torch-sdpa") if name in args.impls})
    for name, reason in skipped.items():
        progress.note(f"skipping {name}: {reason}")
    with progress.step(f"measuring the {peak_dtype(device, args.dtype)} matrix-multiply peak"):
        peak = measure_peak_gflops(device, args.dtype)
    report: dict[str, Any] = {
        "device": device_name(device),
        "dtype": args.dtype,
        "machine": machine_description(device),
        "peak_gflops": peak,
        "peak_dtype": peak_dtype(device, args.dtype),
        "repeat": args.repeat,
        "skipped": skipped,
        "compile": {},
        "results": [],
    }
    for model, config in args.models.items():
        weights = random_attention_weights(config, args.seed)
        progress.note(
            f"GPT-2 {model} (n_embd={config.n_embd}, n_head={config.n_head}): compiling "
            f"{', '.join(name for name in args.impls if name in MAX_CONTENDERS) or 'nothing'}"
        )
        progress.note("(a graph MAX has not compiled before takes about a minute; cached ones take seconds)")
        with progress.step(f"compiling for GPT-2 {model}"):
            contenders = list(max_contenders(config, weights, args, device))
        if "numpy" in args.impls:
            contenders.append(numpy_contender(config, weights))
        if not torch_reason:
            contenders.extend(torch_contenders(config, weights, args, device))
        report["compile"][model] = {c.name: c.compile_seconds for c in contenders if c.compile_seconds}
        for index, (batch, seq_len) in enumerate(shapes, start=1):
            x = np.random.default_rng(args.seed).standard_normal(
                (batch, seq_len, config.n_embd), dtype=np.float32
            )
            with progress.step(
                f"[{index}/{len(shapes)}] GPT-2 {model} {batch}x{seq_len}: {args.repeat} rounds"
            ):
                # Causal: the first CHECKED_TOKENS rows depend on those tokens alone, so the
                # float64 reference need not run at 16k tokens.
                expected = reference.attention(x[:, :CHECKED_TOKENS], weights, config.n_head)
                measured = time_shape(contenders, x, expected, args, device)
            report["results"].extend(summarize(model, config, batch, seq_len, measured, peak))
    if args.cold_compile:
        model, config = next(iter(args.models.items()))
        for impl in (name for name in args.impls if name in MAX_CONTENDERS):
            with progress.step(f"cold compile of {impl} (fresh process, empty MAX cache)"):
                try:
                    seconds = cold_compile_seconds(config, device_name(device), args.dtype, impl)
                except RuntimeError as error:  # the timings already taken stay in the report
                    progress.note(str(error))
                    seconds = None
            report["compile"][model][impl]["cold"] = seconds
    return report


def summarize(
    model: str,
    config: GPT2Config,
    batch: int,
    seq_len: int,
    measured: dict[str, dict[str, Any]],
    peak: float | None,
) -> list[dict[str, Any]]:
    """One row per contender, with throughput and ratios against PyTorch."""
    flops = attention_flops(config, batch, seq_len)
    baselines = {name: measured.get(name, {}).get("seconds") for name in ("torch-sdpa", "torch-eager")}
    rows = []
    for name, result in measured.items():
        row: dict[str, Any] = {"model": model, "batch": batch, "seq_len": seq_len, "impl": name, **result}
        seconds = result.get("seconds")
        if seconds:
            row["tokens_per_second"] = batch * seq_len / seconds
            row["gflops"] = flops / seconds / 1e9
            row["fraction_of_peak"] = row["gflops"] / peak if peak else None
            # > 1: this contender is faster than the PyTorch one.
            row["speedup_vs_sdpa"] = baselines["torch-sdpa"] / seconds if baselines["torch-sdpa"] else None
            row["speedup_vs_eager"] = baselines["torch-eager"] / seconds if baselines["torch-eager"] else None
        rows.append(row)
    return rows
