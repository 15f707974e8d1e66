"""Helpers shared by the commands: step-by-step progress, argument types, the demo checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from max_gpt2.config import GPT2Config
from max_gpt2.testing import write_checkpoint, write_tokenizer


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


def default_cache_dir() -> Path:
    """`$MAX_GPT2_CACHE`, else `$XDG_CACHE_HOME/max-gpt2`, else `~/.cache/max-gpt2`."""
    if explicit := os.environ.get("MAX_GPT2_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "max-gpt2"


def demo_checkpoint(cache_dir: Path, seed: int, progress: Progress) -> Path:
    """A GPT-2-small-shaped checkpoint with a small tokenizer in `cache_dir`, written once, reused after."""
    config = GPT2Config()
    path = cache_dir / f"gpt2-small-seed{seed}"
    if (path / "config.json").is_file():  # written last, so its presence means complete
        progress.note(f"reusing the demo checkpoint in {path}")
        if not (path / "tokenizer.json").is_file():  # written by a version without text
            write_tokenizer(path, config.vocab_size)
        return path
    with progress.step(f"writing a GPT-2-small-shaped checkpoint (seed {seed}) with a tokenizer to {path}"):
        write_checkpoint(path, config, seed=seed, tokenizer=True)
    return path
