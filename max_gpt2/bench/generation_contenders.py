"""The contenders of `max-gpt2 bench-generate`: our `CompiledLM`, Hugging Face's `generate`, llama.cpp.

Each `Generator` is one contender on one checkpoint: greedy generation with a
clock read at every new token, and one forward over a prompt (every position's
logits). `max` is ours in float32, `max-bfloat16`, `max-q8_0` and `max-q4_0` ours
with packed weights; `hf-eager` and `hf-sdpa` are Hugging Face's
`GPT2LMHeadModel` with each attention implementation, loaded from the same
files, when PyTorch and `transformers` are installed (optional peers);
`llama.cpp-<format>` is llama.cpp's `llama-bench` on a GGUF of the same weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import Device
from max.dtype import DType

from max_gpt2.bench import harness, llama_cpp
from max_gpt2.inference.loading import load_lm
from max_gpt2.model.formats import FLOAT32, NAMED, WeightFormat

CONTENDERS = ("max", "hf-eager", "hf-sdpa")


@dataclass
class Generator:
    """One contender on one checkpoint: how it generates, clocked, and how long its prompts take.

    `clocked(ids, new)` returns the time at the call and after every new token;
    `prefill_seconds(ids)` one forward over `ids` (logits at every position);
    `settle()` is untimed work before a timed call (see `harness.settle`).
    `generate` gives greedy tokens for the check before timing (None: not
    comparable, as llama.cpp's). `weights` is the format its weights are read in.
    """

    name: str
    weights: WeightFormat
    clocked: Callable[[np.ndarray, int], list[float]]
    prefill_seconds: Callable[[np.ndarray], float]
    settle: Callable[[], None]
    generate: Callable[[np.ndarray, int], np.ndarray] | None = None
    batch_one_only: bool = False  # llama-bench generates one sequence at a time
    measured_clock: bool = True  # False: rebuilt from reported rates (llama-bench), so no curve


def _timed(call: Callable[[np.ndarray], Any], ids: np.ndarray) -> float:
    start = time.perf_counter()
    call(ids)
    return time.perf_counter() - start


def max_generator(
    checkpoint: Path,
    device: str,
    dtype: str,
    weight_format: WeightFormat = FLOAT32,
    kv_cache: str | None = None,
) -> Generator:
    """Our `CompiledLM`, its weights in `weight_format`: named `max`, or `max-<format>` when packed, and
    `-kv16` or `-kv32` after it with a KV cache other than the format's default
    (`kv_cache`; None: `WeightFormat.cache_dtype`'s default)."""
    lm = load_lm(checkpoint, device, dtype, weight_format=weight_format, kv_cache=kv_cache)
    warm = np.zeros((1, 8), dtype=np.int64)

    def clocked(ids: np.ndarray, new: int) -> list[float]:
        times = [time.perf_counter()]
        times += [time.perf_counter() for _ in lm.stream(ids, new)]
        return times

    packed = lm.weight_format.kernels_only
    name = f"max-{lm.weight_format}" if packed else "max"
    if lm.kv_dtype != lm.weight_format.cache_dtype(None, lm.dtype):
        name += "-kv16" if lm.kv_dtype == DType.float16 else "-kv32"
    return Generator(
        name,
        lm.weight_format if packed else NAMED[dtype],  # float32 weights: the compute dtype's
        clocked,
        lambda ids: _timed(lm.logits, ids),
        lambda: harness.settle(lm.logits, warm),
        lm.generate,
    )


def llama_cpp_generator(binary: Path, gguf: Path, weight_format: WeightFormat, threads: int) -> Generator:
    """llama.cpp's `llama-bench` on a GGUF of the same weights in `weight_format`
    (`max_gpt2.bench.llama_cpp`)."""

    def prefill_seconds(ids: np.ndarray) -> float:
        return ids.shape[1] / float(llama_cpp.bench(binary, gguf, ids.shape[1], 0, threads)["avg_ts"])

    def clocked(ids: np.ndarray, new: int) -> list[float]:
        prefill = prefill_seconds(ids)
        rate = float(llama_cpp.bench(binary, gguf, ids.shape[1], new, threads)["avg_ts"])
        return [0.0, *(prefill + step / rate for step in range(new))]

    return Generator(
        f"llama.cpp-{weight_format}",
        weight_format,
        clocked,
        prefill_seconds,
        lambda: None,  # a process of its own: nothing of ours spins while it runs
        batch_one_only=True,
        measured_clock=False,
    )


def hugging_face_generators(
    checkpoint: Path, names: list[str], dtype: str, device: Device
) -> list[Generator]:
    """`hf-eager` and `hf-sdpa` as asked: GPT2LMHeadModel from the same files on `device` (as PyTorch
    names it), greedy, no early stop."""
    torch = harness.optional_torch()
    import transformers
    from transformers.generation.streamers import BaseStreamer

    transformers.logging.set_verbosity_error()
    torch.set_grad_enabled(False)
    torch_device = harness.torch_device(device)

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:  # the prompt first (the call's start), then each new token
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def make(name: str) -> Generator:
        model = (
            transformers.GPT2LMHeadModel.from_pretrained(
                checkpoint, attn_implementation=name.removeprefix("hf-"), dtype=getattr(torch, dtype)
            )
            .to(torch_device)
            .eval()
        )

        def generate(ids: np.ndarray, new: int, streamer: Any = None) -> np.ndarray:
            # The streamer is handed each token on the host, so its clock waits for the device.
            tokens = torch.from_numpy(ids).to(torch_device)
            options = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None, "streamer": streamer}
            return model.generate(tokens, max_new_tokens=new, min_new_tokens=new, **options).cpu().numpy()

        def clocked(ids: np.ndarray, new: int) -> list[float]:
            clock = Clock()
            generate(ids, new, clock)
            return clock.times

        def forward(ids: np.ndarray) -> Any:
            logits = model(torch.from_numpy(ids).to(torch_device)).logits
            if not device.is_host:
                torch.cuda.synchronize(torch_device)  # the call returns before the GPU is done
            return logits

        warm = np.zeros((1, 8), dtype=np.int64)
        return Generator(
            name,
            NAMED[dtype],
            clocked,
            lambda ids: _timed(forward, ids),
            lambda: harness.settle(forward, warm),
            generate,
        )

    return [make(name) for name in names]


def hugging_face_skip_reason(device: Device) -> str | None:
    """Why Hugging Face cannot run on `device` here, or None."""
    if reason := harness.torch_skip_reason(device):
        return reason
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed (pip install 'max-gpt2[peers]')"
    return None
