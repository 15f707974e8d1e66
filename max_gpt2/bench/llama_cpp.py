"""llama.cpp as an optional peer: its `llama-bench` beside our decoding, on GGUF files of the same weights.

llama.cpp is never built or installed by this package: point `--llama-bench` at a
build (docs/performance.md) and `--gguf` at the checkpoint converted by
its `convert_hf_to_gguf.py` (f32, bf16) and quantized by its `llama-quantize`
(Q8_0, Q4_0): `--gguf float32=x-f32.gguf,bfloat16=x-bf16.gguf,q8_0=x-q8_0.gguf,q4_0=x-q4_0.gguf`.

`llama-bench` reports rates, not a clock: for a case `1xPROMPT+NEW` it runs twice,
`-p PROMPT -n 0` (the prompt's rate, so its prefill time) and `-p 0 -n NEW -d
PROMPT` (NEW tokens generated one at a time after a PROMPT-token context), one
repetition each, with `--threads` threads (default: every core). It generates
one sequence at a time, so it joins batch-1 cases only.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from max_gpt2.model.formats import FORMATS, WeightFormat, format_named


def parse_gguf(spec: str) -> dict[WeightFormat, Path]:
    """`"float32=a.gguf,q8_0=b.gguf"` -> {format: file}, each format one of ours, each file present."""
    files = {}
    for item in (part.strip() for part in spec.split(",") if part.strip()):
        weights, sep, name = item.partition("=")
        if not sep or weights not in FORMATS:
            raise ValueError(
                f"--gguf wants FORMAT=FILE items, FORMAT one of {', '.join(FORMATS)}; got {item!r}"
            )
        if not Path(name).is_file():
            raise FileNotFoundError(f"--gguf {weights}={name}: no such file")
        files[format_named(weights)] = Path(name)
    if not files:
        raise ValueError("--gguf names no file")
    return files


def check_binary(path: str | Path) -> Path:
    """`path` as a runnable llama.cpp binary, or an error naming it."""
    binary = Path(path)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"{binary} is not an executable file (a llama.cpp build's bin/{binary.name})")
    return binary


def bench(binary: Path, gguf: Path, prompt: int, new: int, threads: int) -> dict:
    """One `llama-bench` test, its JSON result: a PROMPT-token prompt (`new` 0), or NEW tokens
    generated after a PROMPT-token context. `avg_ts` is its tokens/s, `build_commit` its build."""
    shape = ["-p", str(prompt), "-n", "0"] if new == 0 else ["-p", "0", "-n", str(new), "-d", str(prompt)]
    command = [str(binary), "-m", str(gguf), *shape, "-r", "1", "-t", str(threads), "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    (result,) = json.loads(done.stdout)
    return result
