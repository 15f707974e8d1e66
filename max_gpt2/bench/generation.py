"""Text generation side by side: what `max-gpt2 bench-generate` runs (also `make bench-generate`).

Contenders, all loading the same checkpoint (`max_gpt2.bench.generation_contenders`):
`max` (our `CompiledLM`), with `--weight-format` also ours with packed weights
(`max-bfloat16`, `max-q8_0`, `max-q4_0`; their KV cache float16 by default, float32
weights' float32), with `--kv-cache float32,float16` each of those also with the
other cache (`-kv16`, `-kv32`), when PyTorch and `transformers` are
installed `hf-eager` and `hf-sdpa` (Hugging Face's `GPT2LMHeadModel.generate` with
each attention implementation), and with `--llama-bench` and `--gguf` llama.cpp's
`llama-bench` on GGUF files of the same weights (`max_gpt2.bench.llama_cpp`). The
checkpoints are GPT-2 small and medium shapes written by `write_checkpoint` into
the cache directory (random weights take as long as trained ones), or yours
with `--checkpoint`. For each model:

1. Hugging Face's greedy tokens (on the same device as ours) must equal ours
   (`max`), case by case, before any timing (in float32 on the host; in bfloat16
   and float16, and on an accelerator, whose float32 products MAX rounds to TF32,
   a near-tie may tip a token, which the report records); packed weights' tokens
   are compared and recorded, not required.
2. Cases `BATCHxPROMPT+NEW` (default 1x32+128 and 8x32+128): interleaved rounds,
   each round every case of every contender in a rotating order, each after
   `harness.settle`; a call records the time of every new token. Prefill is the
   call to the first token; decode rate is every later token over the batch
   divided by its time. Medians over rounds; a ratio (one contender against
   another, "vs ..."; a case of batch B against `1xPROMPT+NEW`, "x batch 1") is
   the median of each round's ratio, both rates from the same minutes (a VM's
   memory speed moves a memory-bound batch 1 more than a batch).
3. Prefill alone: one forward over 1 x `--prefill` tokens (logits at every position,
   as Hugging Face's forward gives them), interleaved the same way.
4. The curve: one batch-1 generation to the model's `n_positions`, tokens/s in
   windows of `CURVE_WINDOW` tokens against the context length (a PNG).

The bandwidth limit: a batch-1 decoding step reads every weight once (the
blocks, the final norm and the LM head, i.e. `wte`; one row each of `wte` and
`wpe`), so its rate cannot pass bandwidth / bytes. Each contender's bytes are
those of the format it reads its weights in (projections and head packed, the
rest float32). The bandwidth is how fast GPT-2's LM head (float32, 154 MB) is read,
measured in the same run (`max_gpt2.bench.bandwidth`: on the host the fastest of a
plain read and NumPy's and our matrix-vector products, on an accelerator a MAX
product there; best of several):
once at the start (the limit lines of the table and the plot), and again before
every round, since a VM's memory speed moves by tens of percent within
minutes; a row's "% of limit" is the median over its rounds of the rate against
that round's limit. A batch of B shares those reads: its limit is B times that.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import Device

from max_gpt2.bench.bandwidth import bandwidth_probe, weight_bytes_per_step
from max_gpt2.bench.generation_contenders import (
    Generator,
    hugging_face_generators,
    hugging_face_skip_reason,
    llama_cpp_generator,
    max_generator,
)
from max_gpt2.bench.harness import in_turn, machine_description
from max_gpt2.inference.devices import device_name, resolve_device
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.model.config import GPT2Config
from max_gpt2.outputs import Progress, default_cache_dir
from max_gpt2.testing import write_checkpoint

MODELS = {
    "small": GPT2Config(),
    "medium": GPT2Config(n_embd=1024, n_head=16, n_layer=24),
}
CURVE_WINDOW = 32  # tokens per point of the curve
CURVE_PROMPT = 16
START_REPEAT, ROUND_REPEAT = 20, 8  # products timed for the bandwidth at the start, and each round


def rates(times: list[float], batch: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s over the batch) from a call's clock."""
    decoded = len(times) - 2  # the tokens after the first
    return times[1] - times[0], batch * decoded / (times[-1] - times[1]) if decoded else float("nan")


def round_by_round(ours: list[tuple[float, float]], theirs: list[tuple[float, float]]) -> float:
    """The median over rounds of our decode rate over theirs in the same round ((prefill, rate) each):
    both measured minutes apart at most, where a VM's memory speed moves by tens of percent."""
    return statistics.median(mine / other for (_, mine), (_, other) in zip(ours, theirs, strict=True))


def interleaved(
    jobs: list[tuple[str, Generator]],
    rounds: int,
    run: Callable[[str, Generator], Any],
    before_round: Callable[[], None] = lambda: None,
) -> dict[tuple[str, str], list[Any]]:
    """`run(label, generator)` for every (label, generator) job, `rounds` times in a rotating order,
    each after the generator settles; `before_round()` at the start of each round. Results by
    (label, generator name), one per round."""
    results: dict[tuple[str, str], list[Any]] = {(label, g.name): [] for label, g in jobs}
    for index in range(rounds):
        before_round()
        for label, generator in in_turn(jobs, index):
            generator.settle()
            results[label, generator.name].append(run(label, generator))
    return results


def same_tokens(
    name: str,
    case: str,
    ids: np.ndarray,
    new: int,
    timed: list[Generator],
    args: argparse.Namespace,
    progress: Progress,
) -> dict[str, bool]:
    """Whether each contender that generates gives the first one's (ours) greedy tokens; Hugging Face's
    differing stops the run in float32 on the host."""
    with progress.step(f"{name} {case}: the same tokens from every contender"):
        expected = timed[0].generate(ids, new)
        same = {g.name: bool(np.array_equal(g.generate(ids, new), expected)) for g in timed if g.generate}
    differ = [g for g, alike in same.items() if not alike and g.startswith("hf-")]
    # On an accelerator MAX multiplies float32 on TF32 tensor cores (`verify.precision`) and
    # PyTorch does not: a near-tie may tip a token there as in half precision.
    if differ and args.dtype == "float32" and args.on_host:
        raise ValueError(f"{name} {case}: {', '.join(differ)} generated other tokens than max")
    return same


def bench_model(
    name: str, checkpoint: Path, generators: list[Generator], args: argparse.Namespace, progress: Progress
) -> dict[str, Any]:
    """Checks tokens, then times the cases, the prefill and the curve for one checkpoint."""
    config = Checkpoint(checkpoint).config
    step_bytes = {g.weights.name: weight_bytes_per_step(config, g.weights) for g in generators}
    limits = {weights: args.bandwidth / size for weights, size in step_bytes.items()}
    rng = np.random.default_rng(args.seed)
    report: dict[str, Any] = {"config": config.to_dict(), "limit_tokens_per_second": limits, "cases": []}
    cases = {f"{b}x{p}+{n}": (rng.integers(0, config.vocab_size, (b, p)), n) for b, p, n in args.cases}
    timed = {
        case: [g for g in generators if ids.shape[0] == 1 or not g.batch_one_only]
        for case, (ids, _) in cases.items()
    }
    same = {case: same_tokens(name, case, *cases[case], timed[case], args, progress) for case in cases}
    bandwidths: list[float] = []
    with progress.step(f"{name} {', '.join(cases)}: {args.rounds} rounds"):
        clocks = interleaved(
            [(case, g) for case in cases for g in timed[case]],
            args.rounds,
            lambda case, g: g.clocked(*cases[case]),
            lambda: bandwidths.append(args.round_bandwidth()),
        )
    # (prefill seconds, decode rate) a round, by (case, contender)
    rounds = {
        (case, g): [rates(t, cases[case][0].shape[0]) for t in each] for (case, g), each in clocks.items()
    }
    for case, (ids, new) in cases.items():
        batch = ids.shape[0]
        alone = f"1x{ids.shape[1]}+{new}"  # the same prompts' length and new tokens at batch 1
        for g in timed[case]:
            prefill, rate = (statistics.median(v) for v in zip(*rounds[case, g.name], strict=True))
            round_rates = [rate for _, rate in rounds[case, g.name]]
            fractions = [
                r * step_bytes[g.weights.name] / (bandwidth * batch)
                for r, bandwidth in zip(round_rates, bandwidths, strict=True)
            ]
            row = {"contender": g.name, "weights": g.weights.name, "case": case, "prefill_ms": prefill * 1e3}
            row |= {"tokens_per_second": rate, "fraction_of_limit": statistics.median(fractions)}
            row |= {
                "round_tokens_per_second": round_rates,
                "round_bandwidth_gb_per_second": [bandwidth / 1e9 for bandwidth in bandwidths],
            }
            row["speedup"] = {
                peer.name: round_by_round(rounds[case, g.name], rounds[case, peer.name])
                for peer in timed[case]
                if peer is not g
            }
            if batch > 1 and (alone, g.name) in rounds:
                row["over_batch_1"] = round_by_round(rounds[case, g.name], rounds[alone, g.name])
            row["same_tokens_as_max"] = same[case].get(g.name)
            report["cases"].append(row)
    if args.prefill:
        ids = rng.integers(0, config.vocab_size, (1, min(args.prefill, config.n_positions)))
        with progress.step(f"{name} prefill 1x{ids.shape[1]}: {args.rounds} rounds"):
            jobs = [("prefill", g) for g in generators]
            seconds = interleaved(jobs, args.rounds, lambda _, g, i=ids: g.prefill_seconds(i))
        report["prefill"] = {"tokens": ids.shape[1]} | {
            g: statistics.median(s) * 1e3 for (_, g), s in seconds.items()
        }
    if args.curve:
        ids = rng.integers(0, config.vocab_size, (1, CURVE_PROMPT))
        new = config.n_positions - CURVE_PROMPT
        clocked = [g for g in generators if g.measured_clock]
        with progress.step(f"{name} curve: 1x{CURVE_PROMPT}+{new}, once per contender"):
            clocks = interleaved(
                [("curve", g) for g in clocked], 1, lambda _, g, i=ids, n=new: g.clocked(i, n)
            )
        report["curve"] = {g: curve(times[0], CURVE_PROMPT) for (_, g), times in clocks.items()}
    return report


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


def contenders(
    path: Path, args: argparse.Namespace, skipped: dict[str, str], device: Device
) -> list[Generator]:
    """Every contender on the checkpoint at `path`: ours per `--weight-format` and Hugging Face's on
    `device`, llama.cpp's on the host."""
    generators = [
        max_generator(path, args.device, args.dtype, weight_format, kv_cache)
        for weight_format in args.weight_format
        for kv_cache in args.kv_cache
    ]
    wanted = [c for c in args.contenders if c != "max" and c not in skipped]
    generators += hugging_face_generators(path, wanted, args.dtype, device) if wanted else []
    for weights, gguf in args.gguf.items():
        generators.append(llama_cpp_generator(args.llama_bench, gguf, weights, args.threads))
    return generators


def run_benchmark(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    device = resolve_device(args.device)
    skipped = {}
    if (reason := hugging_face_skip_reason(device)) is not None:
        skipped = {name: reason for name in args.contenders if name != "max"}
    for name, reason in skipped.items():
        progress.note(f"skipping {name}: {reason}")
    args.on_host = device.is_host
    ways = "a plain read, NumPy, skinny_matmul" if device.is_host else f"a MAX graph on {device_name(device)}"
    with progress.step(f"measuring the bandwidth of a float32 LM head ({ways})"):
        probe = bandwidth_probe(device)
        bandwidths = probe(START_REPEAT)
        args.bandwidth = max(bandwidths.values())
    args.round_bandwidth = lambda: max(probe(ROUND_REPEAT).values())
    report: dict[str, Any] = {
        "device": device_name(device),
        "dtype": args.dtype,
        "machine": machine_description(device),
        "bandwidth_gb_per_second": args.bandwidth / 1e9,
        "bandwidth_by_way_gb_per_second": {name: value / 1e9 for name, value in bandwidths.items()},
        "rounds": args.rounds,
        "skipped": skipped,
        "models": {},
    }
    if args.gguf:
        report["llama_cpp"] = {"binary": str(args.llama_bench), "threads": args.threads}
        report["llama_cpp"]["gguf"] = {weights.name: str(file) for weights, file in args.gguf.items()}
    checkpoints = {str(args.checkpoint): Path(args.checkpoint)} if args.checkpoint else {}
    cache = args.cache_dir or default_cache_dir()
    checkpoints |= {name: demo_checkpoint_for(name, cache, progress) for name in args.models}
    for name, path in checkpoints.items():
        with progress.step(
            f"{name}: loading every contender (ours compiles: a minute or two the first time)"
        ):
            generators = contenders(path, args, skipped, device)
        report["models"][name] = bench_model(name, path, generators, args, progress)
    return report
