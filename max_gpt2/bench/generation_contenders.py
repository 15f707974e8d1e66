"""The contenders of `max-gpt2 bench-generate`: our `CompiledLM` and Hugging Face's `generate`.

Each `Generator` loads one checkpoint and gives greedy generation, the same with
a clock read at every new token, and one forward over a prompt (every
position's logits). `hf-eager` and `hf-sdpa` are Hugging Face's
`GPT2LMHeadModel` with each attention implementation, loaded from the same
files, when PyTorch and `transformers` are installed (optional peers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from max_gpt2.bench import harness
from max_gpt2.inference.lm import load_lm

CONTENDERS = ("max", "hf-eager", "hf-sdpa")


@dataclass
class Generator:
    """One contender on one checkpoint: greedy generation with a clock on every token, and a forward."""

    name: str
    generate: Callable[[np.ndarray, int], np.ndarray]  # ids [B, S], new -> int64 [B, S + new]
    clocked: Callable[[np.ndarray, int], list[float]]  # perf_counter at the call, then at every new token
    forward: Callable[[np.ndarray], Any]  # one forward over ids, logits at every position


def max_generator(checkpoint: Path, device: str, dtype: str) -> Generator:
    lm = load_lm(checkpoint, device, dtype)

    def clocked(ids: np.ndarray, new: int) -> list[float]:
        times = [time.perf_counter()]
        times += [time.perf_counter() for _ in lm.stream(ids, new)]
        return times

    return Generator("max", lm.generate, clocked, lm.logits)


def hugging_face_generators(checkpoint: Path, names: list[str], dtype: str) -> list[Generator]:
    """`hf-eager` and `hf-sdpa` as asked: GPT2LMHeadModel from the same files, greedy, no early stop."""
    torch = harness.optional_torch()
    import transformers
    from transformers.generation.streamers import BaseStreamer

    transformers.logging.set_verbosity_error()
    torch.set_grad_enabled(False)

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:  # the prompt first (the call's start), then each new token
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def make(name: str) -> Generator:
        model = transformers.GPT2LMHeadModel.from_pretrained(
            checkpoint, attn_implementation=name.removeprefix("hf-"), dtype=getattr(torch, dtype)
        ).eval()

        def generate(ids: np.ndarray, new: int, streamer: Any = None) -> np.ndarray:
            tokens = torch.from_numpy(ids)
            options = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None, "streamer": streamer}
            return model.generate(tokens, max_new_tokens=new, min_new_tokens=new, **options).numpy()

        def clocked(ids: np.ndarray, new: int) -> list[float]:
            clock = Clock()
            generate(ids, new, clock)
            return clock.times

        return Generator(name, generate, clocked, lambda ids: model(torch.from_numpy(ids)))

    return [make(name) for name in names]


def hugging_face_skip_reason() -> str | None:
    """Why Hugging Face cannot run here, or None."""
    if harness.optional_torch() is None:
        return "PyTorch is not installed (pip install 'max-gpt2[peers]')"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed (pip install 'max-gpt2[peers]')"
    return None
