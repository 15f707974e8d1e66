"""The contenders of `max-gpt2 bench`: our attention implementations, the NumPy reference, PyTorch.

Each `Contender` is one implementation at one model size, with how to turn a
float32 NumPy input into what it takes (`prepare`), the call itself, and how to
read its output back for checking (`finish`). On CPU every call takes and
returns NumPy (conversion included: it is what a caller pays); on GPU inputs
and outputs stay on the device and every call ends with a synchronize.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from max.driver import Buffer, Device

from max_gpt2 import reference
from max_gpt2.bench import harness
from max_gpt2.inference.attention import compile_attention
from max_gpt2.inference.devices import to_buffer, to_numpy
from max_gpt2.model.config import GPT2Config

MAX_CONTENDERS = ("graph", "flash", "wrapper")
CONTENDERS = (*MAX_CONTENDERS, "numpy", "torch-eager", "torch-sdpa")

Call = Callable[[Any], Any]


@dataclass
class Contender:
    """One implementation at one model size: how to call it and what was measured."""

    name: str
    call: Call  # input as `prepare` makes it -> output
    prepare: Callable[[np.ndarray], Any]  # float32 NumPy input -> what `call` takes
    finish: Callable[[Any], np.ndarray]  # output -> float32/float64 NumPy, for checking
    compile_seconds: dict[str, float | None] = field(default_factory=dict)


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
    torch = harness.optional_torch()
    functional = torch.nn.functional
    torch_device = harness.torch_device(device)
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
