"""What the tools write, and where: progress lines, the cache directory, whole files, pictures.

`Progress` reports each step of long work on stderr (with a live counter on a
terminal). `default_cache_dir` is where generated checkpoints are kept.
`write_atomically` writes under a temporary name beside the target and renames
it into place, so a reader sees the old file or the whole new one, never a part.
`require_matplotlib` gives pyplot on a file-only backend, or says how to install
it (an optional dependency: `pip install 'max-gpt2[plot]'`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO


class Progress:
    """Step-by-step progress on a stream, with a live elapsed-time counter on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def note(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[dict[str, float]]:
        """Reports `label`, then how long it took; yields a dict that receives `seconds`."""
        timing: dict[str, float] = {}
        start = time.perf_counter()
        done = threading.Event()
        ticker = None
        if self.stream.isatty():
            ticker = threading.Thread(target=self._tick, args=(label, start, done), daemon=True)
            ticker.start()
        else:
            self.note(f"{label} ...")
        try:
            yield timing
        finally:
            done.set()
            if ticker is not None:
                ticker.join()
            timing["seconds"] = time.perf_counter() - start
        self.note(f"{label}: done in {timing['seconds']:.2f} s")

    def _tick(self, label: str, start: float, done: threading.Event) -> None:
        while not done.wait(0.5):
            print(f"\r{label} ... {time.perf_counter() - start:.0f} s", end="", file=self.stream, flush=True)
        print("\r", end="", file=self.stream, flush=True)


def default_cache_dir() -> Path:
    """`$MAX_GPT2_CACHE`, else `$XDG_CACHE_HOME/max-gpt2`, else `~/.cache/max-gpt2`."""
    if explicit := os.environ.get("MAX_GPT2_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "max-gpt2"


ABANDONED_S = 600  # a partial file untouched this long, its writer gone, is left over (`write_atomically`)


def write_atomically(file: Path, write: Callable[[Path], Any]) -> None:
    """Calls `write` on a temporary name beside `file`, then renames it into place; a failed or
    interrupted write leaves no partial file. The name is this process's own, so processes writing
    the same file at once do not mix their bytes: the last rename wins, whole. What a process killed
    outright (SIGKILL, a power cut) left of the same file is removed first: a partial file whose
    writer is gone and which no one has written to for `ABANDONED_S` (the pid alone could be another
    container's)."""
    partial = file.with_name(f"{file.name}.{os.getpid()}.{threading.get_ident()}.partial")
    for left in file.parent.glob(f"{glob.escape(file.name)}.*.*.partial"):
        with contextlib.suppress(OSError):  # another writer may remove it first
            idle = time.time() - left.stat().st_mtime
            if idle > ABANDONED_S and not _running(left.name[len(file.name) + 1 :].split(".")[0]):
                left.unlink()
    try:
        write(partial)
        os.replace(partial, file)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _running(pid: str) -> bool:
    """Whether the process `pid` (a partial file's writer) may still be running: True unless it is gone."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):  # not a pid of ours to judge, or another user's process
        return True
    return True


def require_matplotlib() -> Any:
    """`matplotlib.pyplot` on a file-only backend, or a clear error saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "drawing needs matplotlib, which is not installed: pip install 'max-gpt2[plot]'"
        ) from None
    return plt
