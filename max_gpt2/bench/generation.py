"""Text generation side by side: what `max-gpt2 bench-generate` runs (also `make bench-generate`).

Contenders, all loading the same checkpoint: `max` (our `CompiledLM`) and, when
PyTorch and `transformers` are installed, `hf-eager` and `hf-sdpa` (Hugging
Face's `GPT2LMHeadModel.generate` with each attention implementation). The
checkpoints are GPT-2 small and medium shapes written by `write_checkpoint` into
the cache directory (random weights take as long as trained ones), or yours
with `--checkpoint`. For each model:

1. Every contender's greedy tokens must equal ours, case by case, before any timing
   (in float32; in bfloat16 and float16 rounding may tip a token, which the report records).
2. Cases `BATCHxPROMPT+NEW` (default 1x32+128 and 8x32+128): interleaved rounds,
   each contender in a rotating order after `measure.settle`; a round records the
   time of every new token. Prefill is the call to the first token; decode rate is
   every later token over the batch divided by its time. Medians over rounds.
3. Prefill alone: one forward over 1 x `--prefill` tokens (logits at every position,
   as Hugging Face's forward gives them), interleaved the same way.
4. The curve: one batch-1 generation to the model's `n_positions`, tokens/s in
   windows of `CURVE_WINDOW` tokens against the context length (a PNG).

The bandwidth limit: a batch-1 decoding step reads every weight once (the
blocks, the final norm and the LM head, i.e. `wte`; one row each of `wte` and
`wpe`), so its rate cannot pass bandwidth / bytes. The bandwidth is a float32
matrix-vector product of GPT-2's LM head (154 MB) measured in the same run
(the faster of NumPy's and our `skinny_matmul` kernel's, best of several). A
batch of B shares those reads: its limit is B times that.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import CPU, Buffer
from max.engine import InferenceSession

from max_gpt2.bench.generation_contenders import (
    Generator,
    hugging_face_generators,
    hugging_face_skip_reason,
    max_generator,
)
from max_gpt2.bench.harness import machine_description, settle
from max_gpt2.bench.report import save_figure
from max_gpt2.inference.devices import device_name, resolve_device
from max_gpt2.kernels import skinny_matmul_graph
from max_gpt2.model.checkpoint import Checkpoint
from max_gpt2.model.config import GPT2Config
from max_gpt2.outputs import Progress, default_cache_dir, require_matplotlib
from max_gpt2.testing import write_checkpoint

MODELS = {
    "small": GPT2Config(),
    "medium": GPT2Config(n_embd=1024, n_head=16, n_layer=24),
}
CURVE_WINDOW = 32  # tokens per point of the curve
CURVE_PROMPT = 16


def weight_bytes_per_step(config: GPT2Config, bytes_per_value: int = 4) -> int:
    """Bytes of weights one batch-1 decoding step reads (see the module docstring)."""
    width, inner = config.n_embd, config.mlp_width
    block = (
        2 * 2 * width  # ln_1, ln_2
        + 3 * width * width
        + 3 * width  # c_attn
        + width * width
        + width  # attn.c_proj
        + width * inner
        + inner  # mlp.c_fc
        + inner * width
        + width  # mlp.c_proj
    )
    head = config.vocab_size * width  # the tied LM head reads all of wte
    return (config.n_layer * block + 2 * width + head + 2 * width) * bytes_per_value


def matvec_bandwidth(repeat: int = 20) -> dict[str, float]:
    """Bytes per second of GPT-2's LM head as a float32 matrix-vector product, best of `repeat` each.

    Two ways, NumPy's and our `skinny_matmul` (`max_gpt2.kernels`), so the limit
    comes from the fastest stream of weights this machine gives, not only ours.
    The matrix (50257 x 768, 154 MB) is far larger than any cache, whatever model is timed.
    """
    config = MODELS["small"]
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((config.vocab_size, config.n_embd), dtype=np.float32)
    vector = rng.standard_normal((1, config.n_embd), dtype=np.float32)
    kernel = InferenceSession(devices=[CPU()]).load(skinny_matmul_graph())
    weights, row = Buffer.from_numpy(matrix), Buffer.from_numpy(vector)
    products = {"numpy": lambda: matrix @ vector[0], "skinny_matmul": lambda: kernel.execute(row, weights)}
    bandwidth = {}
    for name, product in products.items():
        product(), product()  # the first passes fault pages and fill the TLB: not the steady state
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
        bandwidth[name] = matrix.nbytes / best
    return bandwidth


def rates(times: list[float], batch: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s over the batch) from a call's clock."""
    decoded = len(times) - 2  # the tokens after the first
    return times[1] - times[0], batch * decoded / (times[-1] - times[1]) if decoded else float("nan")


def interleaved(
    generators: list[Generator], rounds: int, run: Callable[[Generator], Any], warm: np.ndarray
) -> dict:
    """`run(generator)` for every generator, `rounds` times in a rotating order, each after settling."""
    results: dict[str, list[Any]] = {g.name: [] for g in generators}
    for index in range(rounds):
        shift = index % len(generators)
        for generator in generators[shift:] + generators[:shift]:
            settle(generator.forward, warm)
            results[generator.name].append(run(generator))
    return results


def bench_model(
    name: str, checkpoint: Path, generators: list[Generator], args: argparse.Namespace, progress: Progress
) -> dict[str, Any]:
    """Checks tokens, then times the cases, the prefill and the curve for one checkpoint."""
    config = Checkpoint(checkpoint).config
    limit = args.bandwidth / weight_bytes_per_step(config)
    rng = np.random.default_rng(args.seed)
    warm = rng.integers(0, config.vocab_size, (1, 8))
    report: dict[str, Any] = {"config": config.to_dict(), "limit_tokens_per_second": limit, "cases": []}
    for batch, prompt, new in args.cases:
        ids = rng.integers(0, config.vocab_size, (batch, prompt))
        with progress.step(f"{name} {batch}x{prompt}+{new}: same tokens from every contender"):
            expected = generators[0].generate(ids, new)
            differ = [g.name for g in generators[1:] if not np.array_equal(g.generate(ids, new), expected)]
        if differ and args.dtype == "float32":
            raise ValueError(
                f"{name} {batch}x{prompt}+{new}: {', '.join(differ)} generated other tokens than max"
            )
        with progress.step(f"{name} {batch}x{prompt}+{new}: {args.rounds} rounds"):
            clocks = interleaved(generators, args.rounds, lambda g, i=ids, n=new: g.clocked(i, n), warm)
        medians = {
            g.name: [
                statistics.median(v) for v in zip(*(rates(t, batch) for t in clocks[g.name]), strict=True)
            ]
            for g in generators
        }
        for contender, (prefill, rate) in medians.items():
            row = {"contender": contender, "case": f"{batch}x{prompt}+{new}", "prefill_ms": prefill * 1e3}
            row |= {"tokens_per_second": rate, "fraction_of_limit": rate / (limit * batch)}
            row["speedup"] = {peer: rate / other for peer, (_, other) in medians.items() if peer != contender}
            row["same_tokens_as_max"] = contender not in differ
            report["cases"].append(row)
    if args.prefill:
        ids = rng.integers(0, config.vocab_size, (1, min(args.prefill, config.n_positions)))
        with progress.step(f"{name} prefill 1x{ids.shape[1]}: {args.rounds} rounds"):
            seconds = interleaved(generators, args.rounds, lambda g, i=ids: _timed(g.forward, i), warm)
        report["prefill"] = {"tokens": ids.shape[1]} | {
            g: statistics.median(s) * 1e3 for g, s in seconds.items()
        }
    if args.curve:
        ids = rng.integers(0, config.vocab_size, (1, CURVE_PROMPT))
        new = config.n_positions - CURVE_PROMPT
        with progress.step(f"{name} curve: 1x{CURVE_PROMPT}+{new}, once per contender"):
            clocks = interleaved(generators, 1, lambda g, i=ids, n=new: g.clocked(i, n), warm)
        report["curve"] = {g: curve(times[0], CURVE_PROMPT) for g, times in clocks.items()}
    return report


def _timed(call: Callable[[np.ndarray], Any], ids: np.ndarray) -> float:
    start = time.perf_counter()
    call(ids)
    return time.perf_counter() - start


def curve(times: list[float], prompt: int) -> list[tuple[int, float]]:
    """(context length, tokens/s) per window of `CURVE_WINDOW` decoded tokens (fewer for short runs)."""
    window = max(1, min(CURVE_WINDOW, (len(times) - 2) // 8))
    return [
        (prompt + first + window - 1, window / (times[first + window] - times[first]))
        for first in range(1, len(times) - window, window)
    ]


def demo_checkpoint_for(name: str, cache_dir: Path, progress: Progress) -> Path:
    """The seeded checkpoint of `MODELS[name]` in `cache_dir`, written once."""
    path = cache_dir / f"gpt2-{name}-bench"
    if not (path / "config.json").is_file():  # written last: present means complete
        with progress.step(f"writing a GPT-2-{name}-shaped checkpoint to {path}"):
            write_checkpoint(path, MODELS[name], seed=0)
    return path


def run_benchmark(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    device = resolve_device(args.device)
    skipped = {}
    if (reason := hugging_face_skip_reason()) is not None:
        skipped = {name: reason for name in args.contenders if name != "max"}
    for name, reason in skipped.items():
        progress.note(f"skipping {name}: {reason}")
    with progress.step("measuring float32 matrix-vector bandwidth (NumPy and skinny_matmul)"):
        bandwidths = matvec_bandwidth()
        args.bandwidth = max(bandwidths.values())
    report: dict[str, Any] = {
        "device": device_name(device),
        "dtype": args.dtype,
        "machine": machine_description(device),
        "bandwidth_gb_per_second": args.bandwidth / 1e9,
        "matvec_gb_per_second": {name: value / 1e9 for name, value in bandwidths.items()},
        "rounds": args.rounds,
        "skipped": skipped,
        "models": {},
    }
    checkpoints = {str(args.checkpoint): Path(args.checkpoint)} if args.checkpoint else {}
    cache = args.cache_dir or default_cache_dir()
    checkpoints |= {name: demo_checkpoint_for(name, cache, progress) for name in args.models}
    for name, path in checkpoints.items():
        with progress.step(
            f"{name}: loading every contender (ours compiles: a minute or two the first time)"
        ):
            generators = [max_generator(path, args.device, args.dtype)]
            wanted = [c for c in args.contenders if c != "max" and c not in skipped]
            generators += hugging_face_generators(path, wanted, args.dtype) if wanted else []
        report["models"][name] = bench_model(name, path, generators, args, progress)
    return report


def format_table(report: dict[str, Any]) -> str:
    """The report as Markdown tables: the cases, then the prefill."""
    lines = [
        f"{report['device']} {report['dtype']}; float32 matrix-vector bandwidth "
        f"{report['bandwidth_gb_per_second']:.1f} GB/s ("
        + ", ".join(f"{name} {value:.1f}" for name, value in report["matvec_gb_per_second"].items())
        + f"); medians of {report['rounds']} rounds",
        "",
        "| model | case | contender | prefill ms | decode tokens/s | % of limit | vs hf-sdpa | vs hf-eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, result in report["models"].items():
        for row in result["cases"]:
            ratios = [row["speedup"].get(peer) for peer in ("hf-sdpa", "hf-eager")]
            lines.append(
                f"| {model} | {row['case']} | {row['contender']} | {row['prefill_ms']:.1f} "
                f"| {row['tokens_per_second']:.1f} | {100 * row['fraction_of_limit']:.0f} | "
                + " | ".join("-" if ratio is None else f"{ratio:.2f}x" for ratio in ratios)
                + " |"
            )
        lines.append(f"| {model} | limit, batch 1 | | | {result['limit_tokens_per_second']:.1f} | 100 | | |")
    prefills = {model: result["prefill"] for model, result in report["models"].items() if "prefill" in result}
    for model, prefill in prefills.items():
        timed = ", ".join(f"{name} {ms:.1f} ms" for name, ms in prefill.items() if name != "tokens")
        lines.append(
            f"\nprefill, {model}, 1 x {prefill['tokens']} tokens (forward, every position's logits): {timed}"
        )
    lines += [f"skipped {name}: {reason}" for name, reason in report["skipped"].items()]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Decode tokens/s against context length, one panel per model; why not, if it can't."""
    curves = {model: result for model, result in report["models"].items() if "curve" in result}
    if not curves:
        return "no curve was measured (--no-curve)"
    try:
        plt = require_matplotlib()
    except ImportError as error:
        return str(error)
    figure, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.5), squeeze=False)
    for axis, (model, result) in zip(axes[0], curves.items(), strict=True):
        for name, points in result["curve"].items():
            axis.plot(*zip(*points, strict=True), marker=".", label=name)
        axis.axhline(result["limit_tokens_per_second"], color="gray", linestyle="--", label="bandwidth limit")
        axis.set(xlabel="context length (tokens)", ylabel="decode tokens/s, batch 1", ylim=(0, None))
        axis.set_title(f"GPT-2 {model}, {report['device']} {report['dtype']}")
        axis.grid(True, alpha=0.3)
        axis.legend()
    save_figure(plt, figure, path)
    return None
