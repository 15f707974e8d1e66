"""Benchmark every attention implementation side by side: `python -m max_gpt2 bench`.

Contenders, all given the same weights and the same input at each shape:
`graph`, `flash` and `wrapper` (ours, compiled with MAX), `numpy` (the float64
reference) and, when PyTorch is installed, `torch-eager` (scores, mask,
softmax) and `torch-sdpa` (`scaled_dot_product_attention`, causal). Rounds are
interleaved, each round timing every contender in a rotating order (one call, or
a burst of up to 10 for calls under 50 ms), so machine noise falls on all of
them alike; the table reports medians. Before its
timed call a contender runs untimed for at least `SETTLE_SECONDS`: right after a
switch, the previous runtime's worker threads (MAX's, PyTorch's OpenMP, NumPy's
BLAS) are still spinning on the same cores. Measured on 2 cores at GPT-2 small,
1 x 128: MAX's 3.8 ms call took 8.8 ms right after a PyTorch call and 7.4 ms
after one untimed call of its own; PyTorch eager took 8.9 ms instead of 4.8 ms
50 ms after a NumPy call, and 4.8 ms after 200 ms.

On CPU each call takes a NumPy array and returns one (conversion included: it
is what a caller pays). Each output is checked against the reference on its
first `CHECKED_TOKENS` positions (all of them, up to 1024 tokens). On GPU
inputs and outputs stay on the device and each call ends with a synchronize.

FLOPs count the useful work: the two projections, and QK^T and PV over the
S(S+1)/2 query-key pairs the causal mask keeps. Peak is a large matrix
multiply measured in the same run: NumPy float32 on CPU, PyTorch in the compute
dtype on GPU. Peak memory is the host RSS a call adds (CPU, Linux); MAX reports
no device allocations, so on GPU it is left out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import Buffer, Device

from max_gpt2 import reference
from max_gpt2.config import GPT2Config
from max_gpt2.console import Progress, positive_int
from max_gpt2.devices import device_name, resolve_device, to_buffer, to_numpy
from max_gpt2.runtime import compile_attention
from max_gpt2.testing import random_attention_weights, write_atomically
from max_gpt2.verify import compare

MODELS = {
    "small": GPT2Config(n_embd=768, n_head=12),
    "medium": GPT2Config(n_embd=1024, n_head=16),
    "large": GPT2Config(n_embd=1280, n_head=20),
    "xl": GPT2Config(n_embd=1600, n_head=25),
}
MAX_CONTENDERS = ("graph", "flash", "wrapper")
CONTENDERS = (*MAX_CONTENDERS, "numpy", "torch-eager", "torch-sdpa")
SETTLE_SECONDS = 0.2
BURST_SECONDS, MAX_BURST = 0.05, 10
CHECKED_TOKENS = 1024  # rows of each output compared with the reference
CPU_SHAPES = "1x128,1x256,1x512,1x1024,8x256"
GPU_SHAPES = "1x128,1x1024,1x4096,1x16384,8x256"

Call = Callable[[Any], Any]


@dataclass
class Contender:
    """One implementation at one model size: how to call it and what was measured."""

    name: str
    call: Call  # input as `prepare` makes it -> output
    prepare: Callable[[np.ndarray], Any]  # float32 NumPy input -> what `call` takes
    finish: Callable[[Any], np.ndarray]  # output -> float32/float64 NumPy, for checking
    compile_seconds: dict[str, float | None] = field(default_factory=dict)


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


def machine_description(device: Device) -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    description: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    if not device.is_host:
        description["gpu"] = getattr(device, "architecture_name", None) or device.label
    for package in ("max", "numpy", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            description[package] = metadata.version(package)
    torch = _torch()
    if torch is not None and not device.is_host and torch.cuda.is_available():
        description["gpu"] = torch.cuda.get_device_name(device.id)
    return description


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def peak_dtype(device: Device, dtype: str) -> str:
    """The dtype the peak is measured in: float32 on CPU (where half precision is for testing, not
    speed), the compute dtype on GPU (whose tensor cores make half precision far faster)."""
    return "float32" if device.is_host else dtype


def measure_peak_gflops(device: Device, dtype: str) -> float | None:
    """Best matrix-multiply rate seen: NumPy float32 on CPU, PyTorch in `dtype` on GPU (None without it)."""
    size = 2048
    if device.is_host:
        a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
        multiply = lambda: a @ a  # noqa: E731
        sync: Callable[[], Any] = lambda: None  # noqa: E731
    else:
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            return None
        size = 8192
        a = torch.randn(size, size, device=f"cuda:{device.id}", dtype=getattr(torch, dtype))
        multiply, sync = (lambda: a @ a), torch.cuda.synchronize
    best = float("inf")
    for _ in range(5):
        sync()
        start = time.perf_counter()
        multiply()
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def _peak_rss_reset() -> int | None:
    """Resets the kernel's peak-RSS mark for this process; returns the current RSS (Linux only)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kib("VmRSS")
    except OSError:
        return None


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"{key} not in /proc/self/status")


def peak_extra_memory_mib(run: Callable[[], Any], device: Device) -> float | None:
    """Host memory a call needs beyond what the process already held (CPU, Linux); None on GPU."""
    if not device.is_host:
        return None  # MAX reports no device allocations to compare with
    before = _peak_rss_reset()
    if before is None:
        return None
    run()
    return max(0, _status_kib("VmHWM") - before) / 1024


def cold_compile_seconds(config: GPT2Config, device: str, dtype: str, impl: str) -> float:
    """One compile in a fresh process whose MAX cache starts empty."""
    code = (
        "import sys, time, json\n"
        "from max_gpt2.config import GPT2Config\n"
        "from max_gpt2.runtime import compile_attention\n"
        "from max_gpt2.testing import random_attention_weights, write_atomically\n"
        "config = GPT2Config.from_dict(json.loads(sys.argv[1]))\n"
        "weights = random_attention_weights(config, 0)\n"
        "start = time.perf_counter()\n"
        "compile_attention(config, weights, sys.argv[2], sys.argv[3], sys.argv[4])\n"
        "print(time.perf_counter() - start)\n"
    )
    with tempfile.TemporaryDirectory(prefix="max-gpt2-cold-") as home:
        env = dict(os.environ, HOME=home, XDG_CACHE_HOME=str(Path(home) / ".cache"))
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(config.to_dict()), device, dtype, impl],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"cold compile of {impl} failed: {done.stderr.strip()[-500:]}")
    return float(done.stdout.strip().splitlines()[-1])


def max_contenders(
    config: GPT2Config, weights: dict[str, np.ndarray], args: argparse.Namespace, device: Device
) -> Iterator[Contender]:
    """Our implementations, each compiled twice: the second compile hits MAX's cache (warm)."""
    for impl in (name for name in args.impls if name in MAX_CONTENDERS):
        start = time.perf_counter()
        compile_attention(config, weights, device, args.dtype, impl)
        first = time.perf_counter() - start
        start = time.perf_counter()
        attention = compile_attention(config, weights, device, args.dtype, impl)
        warm = time.perf_counter() - start
        if device.is_host:
            prepare: Callable[[np.ndarray], Any] = lambda x: x  # noqa: E731
            finish: Callable[[Any], np.ndarray] = np.asarray
            call: Call = attention
        else:
            prepare = lambda x, a=attention: to_buffer(x, a.dtype, device)  # noqa: E731
            finish = lambda y: to_numpy(Buffer.from_dlpack(y))  # noqa: E731
            call = _synchronized(attention, device)
        yield Contender(impl, call, prepare, finish, {"first": first, "warm": warm})


def _synchronized(call: Call, device: Device) -> Call:
    def run(x: Any) -> Any:
        result = call(x)
        device.synchronize()
        return result

    return run


def numpy_contender(config: GPT2Config, weights: dict[str, np.ndarray]) -> Contender:
    """The float64 NumPy reference, one head at a time."""
    return Contender(
        "numpy", lambda x: reference.attention(x, weights, config.n_head), lambda x: x, np.asarray
    )


def torch_contenders(
    config: GPT2Config, weights: dict[str, np.ndarray], args: argparse.Namespace, device: Device
) -> Iterator[Contender]:
    """PyTorch eager (explicit scores) and SDPA, the same math in the same dtype."""
    torch = _torch()
    functional = torch.nn.functional
    torch_device = "cpu" if device.is_host else f"cuda:{device.id}"
    dtype = getattr(torch, args.dtype)
    c_attn_w, c_attn_b, c_proj_w, c_proj_b = (
        torch.from_numpy(weights[name]).to(torch_device, dtype)
        for name in ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")
    )
    heads, head_dim, width = config.n_head, config.head_dim, config.n_embd

    def attend(x: Any, sdpa: bool) -> Any:
        batch, seq_len, _ = x.shape
        qkv = functional.linear(x, c_attn_w, c_attn_b).view(batch, seq_len, 3, heads, head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4)  # [B, H, S, d] each
        if sdpa:
            attended = functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        else:
            scores = query @ key.transpose(-1, -2) / head_dim**0.5
            future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).triu(1)
            attended = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ value
        return functional.linear(attended.transpose(1, 2).reshape(batch, seq_len, width), c_proj_w, c_proj_b)

    def make(sdpa: bool) -> Contender:
        name = "torch-sdpa" if sdpa else "torch-eager"
        if device.is_host:

            def call(x: np.ndarray) -> np.ndarray:
                with torch.inference_mode():
                    return attend(torch.from_numpy(x).to(dtype), sdpa).float().numpy()

            return Contender(name, call, lambda x: x, np.asarray)

        def call_on_device(x: Any) -> Any:
            with torch.inference_mode():
                result = attend(x, sdpa)
            torch.cuda.synchronize()
            return result

        def prepare(x: np.ndarray) -> Any:
            return torch.from_numpy(x).to(torch_device, dtype)

        return Contender(name, call_on_device, prepare, lambda y: y.float().cpu().numpy())

    for sdpa in (False, True):
        if ("torch-sdpa" if sdpa else "torch-eager") in args.impls:
            yield make(sdpa)


def torch_skip_reason(device: Device) -> str | None:
    """Why the PyTorch peers cannot run here, or None."""
    torch = _torch()
    if torch is None:
        return "PyTorch is not installed (pip install 'max-gpt2[peers]')"
    if not device.is_host and not torch.cuda.is_available():
        return "this PyTorch build has no CUDA"
    return None


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
        comparison = compare(output[:, : expected.shape[1]], expected, args.dtype)
        results[contender.name] = {"matches_reference": comparison.passed}
        live.append((contender, prepared))
    times: dict[str, list[float]] = {contender.name: [] for contender, _ in live}
    for round_index in range(args.repeat):
        shift = round_index % max(1, len(live))
        for contender, prepared in live[shift:] + live[:shift]:
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


def settle(call: Call, prepared: Any) -> float:
    """Untimed calls, at least one and for at least `SETTLE_SECONDS`; returns the last one's seconds."""
    start = last_start = time.perf_counter()
    call(prepared)
    while (now := time.perf_counter()) - start < SETTLE_SECONDS:
        last_start = now
        call(prepared)
    return time.perf_counter() - last_start


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


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table, plus compile times and what was skipped."""
    machine = report["machine"]
    peak = report["peak_gflops"]
    lines = [
        f"device {report['device']} ({machine.get('gpu') or machine['cpu']}, {machine['cores']} cores), "
        f"dtype {report['dtype']}, medians over {report['repeat']} interleaved rounds, "
        f"{report['peak_dtype']} matmul peak {_cell(peak, '.0f')} GFLOP/s",
        "",
        "| model | batch x seq | impl | median ms | best ms | tokens/s | GFLOP/s | % of peak | vs SDPA "
        "| vs eager | peak extra MiB | matches reference |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["results"]:
        shape = f"{row['batch']}x{row['seq_len']}"
        if "error" in row:
            lines.append(f"| {row['model']} | {shape} | {row['impl']} | failed: {row['error']} ||||||||")
            continue
        fraction = row["fraction_of_peak"]
        lines.append(
            f"| {row['model']} | {shape} | {row['impl']} "
            f"| {row['seconds'] * 1e3:.2f} | {row['min_seconds'] * 1e3:.2f} "
            f"| {row['tokens_per_second']:,.0f} | {row['gflops']:.1f} "
            f"| {_cell(None if fraction is None else 100 * fraction, '.0f')} "
            f"| {_cell(row['speedup_vs_sdpa'], '.2f')} | {_cell(row['speedup_vs_eager'], '.2f')} "
            f"| {_cell(row['peak_extra_mib'], '.1f')} | {'yes' if row['matches_reference'] else 'NO'} |"
        )
    lines += ["", "compile seconds (first in this run / warm, cached / cold, empty cache):"]
    for model, impls in report["compile"].items():
        for impl, seconds in impls.items():
            cells = " / ".join(_cell(seconds.get(kind), ".1f") for kind in ("first", "warm", "cold"))
            lines.append(f"  {model} {impl}: {cells}")
    lines += [f"skipped {name}: {reason}" for name, reason in report["skipped"].items()]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Median time against sequence length (batch-1 shapes), one panel per model; why not, if it can't."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'max-gpt2[bench]')"
    plotted = [row for row in report["results"] if row["batch"] == 1 and "seconds" in row]
    models = list(dict.fromkeys(row["model"] for row in plotted))
    if not models:
        return "no batch-1 shape was measured (the plot is time against sequence length at batch 1)"
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for axis, model in zip(axes[0], models, strict=True):
        rows = [row for row in plotted if row["model"] == model]
        for impl in dict.fromkeys(r["impl"] for r in rows):
            points = sorted((r["seq_len"], r["seconds"] * 1e3) for r in rows if r["impl"] == impl)
            axis.plot(*zip(*points, strict=True), marker="o", label=impl)
        axis.set(xscale="log", yscale="log", xlabel="sequence length (batch 1)", ylabel="median ms")
        lengths = sorted({r["seq_len"] for r in rows})
        axis.minorticks_off()
        axis.set_xticks(lengths, [str(length) for length in lengths])
        axis.set_title(f"GPT-2 {model}, {report['device']} {report['dtype']}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.tight_layout()
    write_atomically(path, lambda temporary: figure.savefig(temporary, format="png", dpi=110))
    plt.close(figure)
    return None


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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("bench-results"), help="folder for JSON and PNG")
    parser.add_argument(
        "--no-cold-compile",
        dest="cold_compile",
        action="store_false",
        help="skip timing a compile with an empty MAX cache (about a minute per implementation)",
    )


def main(args: argparse.Namespace, progress: Progress) -> int:
    try:
        args.models = parse_models(args.models)
        report = run_benchmark(args, progress)
    except (OSError, ValueError) as error:
        print(f"max-gpt2 bench: error: {error}", file=sys.stderr)
        return 2
    stem = args.output / f"bench-{report['device'].replace(':', '')}-{args.dtype}"
    json_path, png_path = stem.with_suffix(".json"), stem.with_suffix(".png")
    args.output.mkdir(parents=True, exist_ok=True)
    write_atomically(json_path, lambda temporary: temporary.write_text(json.dumps(report, indent=2) + "\n"))
    print(format_table(report))
    print(f"\nresults: {json_path}")
    why_not = plot(report, png_path)
    print(f"plot: {png_path}" if why_not is None else f"plot skipped: {why_not}")
    # A contender that could not run (out of memory) is reported, not a failure; a wrong answer is.
    return 0 if all(row.get("matches_reference", True) for row in report["results"]) else 1
