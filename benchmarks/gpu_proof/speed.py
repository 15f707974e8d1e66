"""Stage 4: decoding speed, ours beside Hugging Face's `generate` on the same device, and the limit.

`max-gpt2 bench-generate`'s contenders and interleaving (`max_gpt2.bench.generation`): ours in each
of the plan's dtypes and Hugging Face's `GPT2LMHeadModel` (SDPA) in the same, where PyTorch runs
on the device. Decoding: tokens/s over the batch after the first token, median over rounds; a
ratio is the median of each round's. A prompt: the time to its first new token. The limit of a
batch of B is B x bandwidth / bytes of weights a step reads (`weight_bytes_per_step`), the
bandwidth that of a copy on the device (bytes read and written).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpu_proof.plan import Plan
from gpu_proof.precompiled import build
from gpu_proof.record import Results
from max_gpt2.bench.bandwidth import weight_bytes_per_step
from max_gpt2.bench.generation import interleaved, rates, round_by_round
from max_gpt2.bench.generation_contenders import (
    hugging_face_generators,
    hugging_face_skip_reason,
    max_generator,
)
from max_gpt2.bench.harness import optional_torch, torch_device
from max_gpt2.inference.devices import resolve_device


def copy_bandwidth(device: Any) -> tuple[float, str]:
    """Bytes read and written per second by a copy of 1 GiB (256 MiB on the host), best of 10 after 2,
    and what copied: PyTorch on a GPU, NumPy on the host."""
    if device.is_host:
        source = np.ones(1 << 26, np.float32)
        target = np.empty_like(source)
        copy, sync, size, how = (lambda: np.copyto(target, source)), (lambda: None), source.nbytes, "NumPy"
    else:
        torch = optional_torch()
        if torch is None or not torch.cuda.is_available():
            return float("nan"), "not measured: no PyTorch with CUDA here"
        source = torch.ones(1 << 28, dtype=torch.float32, device=torch_device(device))
        target = torch.empty_like(source)
        copy, sync, size, how = (lambda: target.copy_(source)), torch.cuda.synchronize, 1 << 30, "PyTorch"
    seconds = []
    for _ in range(12):
        sync()
        start = time.perf_counter()
        copy()
        sync()
        seconds.append(time.perf_counter() - start)
    return 2 * size / min(seconds[2:]), f"{how} copy"


def speed(plan: Plan, results: Results, checkpoint: Path, running: list[str]) -> None:
    device = resolve_device(plan.device)
    if running:
        results.record("timed while other stages still ran", "note", stages=", ".join(running))
    bandwidth, how = copy_bandwidth(device)
    results.record("bandwidth", "done", gb_per_second=round(bandwidth / 1e9, 1), measured_by=how)
    generators = []
    for dtype in plan.dtypes:
        ours = build(
            results, f"ours in {dtype} (load_lm)", lambda d=dtype: max_generator(checkpoint, plan.device, d)
        )
        ours.name = f"max-{dtype}"
        generators.append(ours)
    if reason := hugging_face_skip_reason(device):
        results.record("Hugging Face generate", "skip", reason=reason)
    else:
        for dtype in plan.dtypes:
            (theirs,) = results.timed(
                f"load Hugging Face in {dtype}",
                lambda d=dtype: hugging_face_generators(checkpoint, ["hf-sdpa"], d, device),
            )
            theirs.name = f"hf-sdpa-{dtype}"
            generators.append(theirs)
    rng = np.random.default_rng(11)
    cases = {
        f"{b}x{p}+{n}": (rng.integers(0, plan.lm.vocab_size, (b, p)), n) for b, p, n in plan.decode_cases
    }
    clocks = results.timed(
        f"{plan.rounds} rounds of decoding",
        lambda: interleaved(
            [(case, g) for case in cases for g in generators], plan.rounds, lambda c, g: g.clocked(*cases[c])
        ),
    )
    for case, (ids, _) in cases.items():
        batch = ids.shape[0]
        for g in generators:
            rounds = [rates(times, batch) for times in clocks[case, g.name]]
            rate = statistics.median(r for _, r in rounds)
            limit = batch * bandwidth / weight_bytes_per_step(plan.lm, g.weights)
            fields = {
                "tokens_per_second": round(rate, 1),
                "limit": round(limit),
                "of_limit": f"{rate / limit:.4f}",
            }
            peer = "hf-sdpa-" + g.name.removeprefix("max-")
            if g.name.startswith("max-") and (case, peer) in clocks:
                fields[f"vs_{peer}"] = round(
                    round_by_round(rounds, [rates(t, batch) for t in clocks[case, peer]]), 2
                )
            results.record(f"decode {case} {g.name}", "done", **fields)
    ids = rng.integers(0, plan.lm.vocab_size, (1, plan.prompt))
    firsts = interleaved([("prompt", g) for g in generators], plan.rounds, lambda _, g: g.clocked(ids, 1))
    for (_, name), each in firsts.items():
        seconds = statistics.median(rates(times, 1)[0] for times in each)
        results.record(
            f"first token after a 1x{plan.prompt} prompt {name}",
            "done",
            ms=round(seconds * 1e3, 2),
            prompt_tokens_per_second=round(plan.prompt / seconds),
        )
