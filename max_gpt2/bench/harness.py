"""What a benchmark measures besides its contenders: the machine, a matmul peak, memory, compiles.

Shared by `max-gpt2 bench`, `max-gpt2 bench-generate` and the scripts in `benchmarks/`: a description of
the machine and package versions for every report, the best matrix-multiply
rate seen in the same run (to state speed as a fraction of what the hardware
does), the host memory a call adds, one compile in a fresh process with an
empty MAX cache, and `settle`, which lets the previous runtime's worker
threads go quiet before a timed call (see `SETTLE_SECONDS`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from max.driver import Device

from max_gpt2.model.config import GPT2Config

SETTLE_SECONDS = 0.2
"""Untimed running before a timed call: right after another runtime's call (PyTorch's, NumPy's), whose
threads spin a while, a call took about twice as long; after this long it took its usual time
(docs/performance.md)."""

T = TypeVar("T")


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
    torch = optional_torch()
    if torch is not None and not device.is_host and torch.cuda.is_available():
        description["gpu"] = torch.cuda.get_device_name(device.id)
    return description


def optional_torch() -> Any:
    """PyTorch if it is installed, else None (it is an optional peer)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_device(device: Device) -> str:
    """MAX's `device` as PyTorch names it: "cpu" or "cuda:N"."""
    return "cpu" if device.is_host else f"cuda:{device.id}"


def torch_skip_reason(device: Device) -> str | None:
    """Why the PyTorch peers cannot run here, or None."""
    torch = optional_torch()
    if torch is None:
        return "PyTorch is not installed (pip install 'max-gpt2[peers]')"
    if not device.is_host and not torch.cuda.is_available():
        return "this PyTorch build has no CUDA"
    return None


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
        torch = optional_torch()
        if torch is None or not torch.cuda.is_available():
            return None
        size = 8192
        a = torch.randn(size, size, device=torch_device(device), dtype=getattr(torch, dtype))
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
        "from max_gpt2 import GPT2Config, compile_attention\n"
        "from max_gpt2.testing import random_attention_weights\n"
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


def in_turn(items: list[T], index: int) -> list[T]:
    """`items` rotated by `index`: the order of round (or pair of calls) `index`, so that each goes
    first in turn and none gains from always following the same one."""
    shift = index % max(1, len(items))
    return items[shift:] + items[:shift]


def settle(call: Callable[[Any], Any], prepared: Any) -> float:
    """Untimed calls, at least one and for at least `SETTLE_SECONDS`; returns the last one's seconds."""
    start = last_start = time.perf_counter()
    call(prepared)
    while (now := time.perf_counter()) - start < SETTLE_SECONDS:
        last_start = now
        call(prepared)
    return time.perf_counter() - last_start


def ratio_summary(ratios: Sequence[float]) -> str:
    """Paired ratios as the median and their middle half: "1.234 (middle half 1.100-1.300)"; a middle
    half that straddles 1 reads as no difference."""
    ordered, quarter = sorted(ratios), len(ratios) // 4
    return (
        f"{statistics.median(ordered):.3f} (middle half {ordered[quarter]:.3f}-{ordered[-1 - quarter]:.3f})"
    )
