"""Results as they come: one JSON line each in DIR/results.jsonl, and DIR/summary.md rewritten from them.

Every stage process appends to the same file (under a lock), so a run stopped at its limit
still leaves all it saw. A result's `status`: "pass", "fail", "skip" (with a reason), "error",
"stopped", "note", or "done" (a measurement or a step's time, listed apart from the checks).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
FAILED = ("fail", "error", "stopped")


class Results:
    """One stage's results, written to DIR as each is known; `start` is the run's (time.time())."""

    def __init__(self, directory: Path, stage: str, start: float) -> None:
        self.directory, self.stage, self.start = directory, stage, start

    def record(self, check: str, status: str, **fields: Any) -> None:
        entry = {"stage": self.stage, "check": check, "status": status, **fields}
        entry["at_s"] = round(time.time() - self.start, 1)
        with self._locked():
            with (self.directory / "results.jsonl").open("a") as file:
                file.write(json.dumps(entry, default=_plain) + "\n")
            write_summary(self.directory)
        print(f"{status.upper():7} {check}  {brief(fields)}", flush=True)

    def outcome(self, check: str, passed: bool, **fields: Any) -> None:
        self.record(check, "pass" if passed else "fail", **fields)

    def timed(self, what: str, make: Callable[[], T], **fields: Any) -> T:
        """`make()`, recorded as `WHAT` with its wall and CPU seconds (this process's threads)."""
        wall, cpu = time.perf_counter(), cpu_seconds()
        made = make()
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        self.record(what, "done", seconds=round(wall, 1), cpu_seconds=round(cpu, 1), **fields)
        return made

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.directory / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _plain(value: Any) -> Any:
    """NumPy values as JSON."""
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)


def brief(fields: dict[str, Any], limit: int = 400) -> str:
    """`key=value, ...`; nested values as compact JSON."""
    text = ", ".join(
        f"{k}={json.dumps(v, default=_plain) if isinstance(v, (list, dict)) else v}"
        for k, v in fields.items()
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_results(directory: Path) -> list[dict[str, Any]]:
    file = directory / "results.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines() if line] if file.exists() else []


def write_summary(directory: Path) -> None:
    """summary.md: the machine, the checks, then the measurements and each step's time."""
    entries = read_results(directory)
    lines = ["# GPU proof", ""]
    for entry in entries:
        if entry["check"] == "machine":
            lines += [f"Device {entry.get('device')}; {brief(entry.get('machine', {}), 1000)}", ""]
    checks = [e for e in entries if e["status"] != "done"]
    measured = [e for e in entries if e["status"] == "done" and e["check"] != "machine"]
    for title, rows in (("Checks", checks), ("Measurements and times", measured)):
        lines += [f"## {title}", "", "| stage | what | result | details | at (s) |", "|---|---|---|---|---|"]
        for e in rows:
            details = {k: v for k, v in e.items() if k not in ("stage", "check", "status", "at_s")}
            cells = (e["stage"], e["check"], e["status"].upper(), brief(details).replace("|", "/"), e["at_s"])
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        lines.append("")
    count = {status: sum(e["status"] == status for e in checks) for status in ("pass", "skip")}
    failed = sum(e["status"] in FAILED for e in checks)
    lines.append(f"{count['pass']} passed, {failed} failed or unfinished, {count['skip']} skipped.")
    partial = directory / "summary.md.partial"
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, directory / "summary.md")
