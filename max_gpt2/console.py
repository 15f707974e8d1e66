"""Console helpers shared by the commands: step-by-step progress and argument types."""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TextIO


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


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value
