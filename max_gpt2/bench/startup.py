"""Start-up beside llama.cpp: whole processes, from start to their first token, and their peak memory.

What a command-line user waits for and pays, per weight format, on the same weights:

    ours, directory   max-gpt2 generate --checkpoint DIR --weight-format F --tokens 464,3290 (one new token)
    ours, GGUF        max-gpt2 generate --checkpoint F.gguf --tokens 464,3290 (one new token)
    llama.cpp         llama-completion -m F.gguf -p "The cat" -n 1 -t THREADS

F.gguf is what `max-gpt2 convert` writes from DIR, read by both. Every contender runs once
untimed first (the page cache, our weights cache and kept graphs, MAX's cache: warm, as for a
user's second start); then each round runs every contender once, in turn (`harness.in_turn`).
Seconds are the process's wall time from start to exit, peak memory its `ru_maxrss`
(`os.wait4`, in a bare interpreter that starts it: `_LAUNCHER`); each ratio (ours over llama.cpp)
is the median of the rounds' own ratios.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from max_gpt2.bench.harness import in_turn
from max_gpt2.outputs import Progress

TOKENS = "464,3290"  # "The cat" in GPT-2's vocabulary
PROMPT = "The cat"
SOURCES = ("directory", "gguf", "llama.cpp")


@dataclass(frozen=True)
class Contender:
    """One command timed: `source` (`SOURCES`) in weight format `weight_format`."""

    source: str
    weight_format: str
    command: list[str]


def cpu_description() -> dict[str, Any]:
    """The CPU as `lscpu` names it (model name, family, model, stepping) and the vector extensions the
    kernels use, where `lscpu` runs."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {}
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    wanted = ("Model name", "CPU family", "Model", "Stepping", "CPU(s)", "Hypervisor vendor")
    found = {key: fields[key].strip() for key in wanted if key in fields}
    flags = fields.get("Flags", "").split()
    found["extensions"] = [
        flag for flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16") if flag in flags
    ]
    return found


def contenders(
    checkpoint: Path, gguf: Path, weight_format: str, llama: Path | None, threads: int
) -> list[Contender]:
    """Ours from the directory and from the GGUF file, and llama.cpp on the file where it is given."""
    ours = [
        sys.executable,
        "-m",
        "max_gpt2",
        "generate",
        "--device",
        "cpu",
        "--tokens",
        TOKENS,
        "--max-new-tokens",
        "1",
    ]
    found = [
        Contender(
            "directory",
            weight_format,
            [*ours, "--checkpoint", str(checkpoint), "--weight-format", weight_format],
        ),
        Contender("gguf", weight_format, [*ours, "--checkpoint", str(gguf)]),
    ]
    if llama is not None:
        found.append(
            Contender(
                "llama.cpp",
                weight_format,
                [str(llama), "-m", str(gguf), "-p", PROMPT, "-n", "1", "-t", str(threads)],
            )
        )
    return found


_LAUNCHER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""
"""Runs a command from a small process and reports its seconds, peak KiB (Linux) and exit status. A
process's peak counts what it held before `exec`, and a child forked (or spawned) from this one starts
holding all of this one's memory (MAX, imported here, is some 180 MB): a bare interpreter is the parent."""


def run_once(contender: Contender) -> tuple[float, float]:
    """The contender's wall seconds, start to exit, and its peak resident memory in MB."""
    with tempfile.TemporaryFile() as errors:
        launched = subprocess.run(
            [sys.executable, "-S", "-c", _LAUNCHER, *contender.command],
            stdout=subprocess.PIPE,
            stderr=errors,
            env=dict(os.environ),
            check=False,
            text=True,
        )
        seconds, peak_kib, status = launched.stdout.split()
        if int(status) != 0:
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-800:]
            raise RuntimeError(f"{' '.join(contender.command)} failed ({status}):\n{tail}")
    return float(seconds), int(peak_kib) / 1024


def measure(all_contenders: list[Contender], rounds: int, progress: Progress) -> list[dict[str, Any]]:
    """Every contender once untimed, then `rounds` rounds of each in turn: one row per contender with its
    seconds and peak MB a round."""
    for contender in all_contenders:
        with progress.step(f"warming {contender.source} {contender.weight_format}"):
            run_once(contender)
    runs: dict[int, list[tuple[float, float]]] = {id(c): [] for c in all_contenders}
    for index in range(rounds):
        with progress.step(f"round {index + 1} of {rounds}"):
            for contender in in_turn(all_contenders, index):
                runs[id(contender)].append(run_once(contender))
    return [
        {
            "source": c.source,
            "weight_format": c.weight_format,
            "command": c.command,
            "seconds": [seconds for seconds, _ in runs[id(c)]],
            "peak_mb": [peak for _, peak in runs[id(c)]],
        }
        for c in all_contenders
    ]


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per format and source of ours: the median of the rounds' ratios to llama.cpp's seconds and peak MB."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows:
        llama = next(
            (r for r in rows if r["source"] == "llama.cpp" and r["weight_format"] == row["weight_format"]),
            None,
        )
        if llama is None or row is llama:
            continue
        found.setdefault(row["weight_format"], {})[row["source"]] = {
            key: median(ours / theirs for ours, theirs in zip(row[key], llama[key], strict=True))
            for key in ("seconds", "peak_mb")
        }
    return found


def format_table(report: dict[str, Any]) -> str:
    """Markdown: per format, each source's median seconds and peak MB, and ours over llama.cpp."""
    lines = [
        f"Start-up, GPT-2 checkpoint {report['checkpoint']}, {report['rounds']} rounds, load average "
        f"{report['load'][0]:.2f} before, {report['load'][1]:.2f} after; CPU (lscpu): {report['lscpu']}",
        "",
        "| weights | source | first token (s) | peak RSS (MB) | s / llama.cpp | RSS / llama.cpp |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        ratio = report["ratios"].get(row["weight_format"], {}).get(row["source"])
        lines.append(
            f"| {row['weight_format']} | {row['source']} | {median(row['seconds']):.2f} "
            f"| {median(row['peak_mb']):.0f} "
            f"| {'-' if ratio is None else format(ratio['seconds'], '.2f')} "
            f"| {'-' if ratio is None else format(ratio['peak_mb'], '.2f')} |"
        )
    return "\n".join(lines)
