"""Shared fixtures.

Compiling a new graph costs about 45 s (attention) to 100 s (a whole model) on a
2-core machine, so every test gets its compiled attention or language model from
one session-wide cache, keyed by what makes the graph (config, dtype, device,
impl), and binds its own weights with `with_weights` (milliseconds). A clean
`make test` compiles nineteen graphs on CPU: attention for GPT-2 small's and the odd
layout (float32, bfloat16 and flash for the latter), the two language models (a
prompt graph and a decoding-step graph each), the one-layer model with its weights
in bfloat16, q8_0 and q4_0 (one graph each, tests/test_weight_formats.py), the
attention-weights variants of the odd attention and of LM (tests/test_heads.py),
the Mojo kernels alone (tests/test_kernels.py: skinny_matmul, the cached
attention, the packed matmuls together), and for tests/test_serve.py the server's
paged-cache graph, MAX's sampler and `ragged_positions` alone.

MAX compiles on one core most of the time, so on a fresh 2-core machine the
session starts the slow work later tests need in other processes as soon as the
tests are collected: the server `tests/test_serve.py` talks to (it compiles its
own graph and MAX's sampler), and, when `MAX_GPT2_PREWARM=1` (`make test` sets
it), `tests/prewarm.py`, which fills MAX's cache from the last graph the suite
needs while the tests compile from the first.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from max_gpt2 import CompiledAttention, CompiledLM, GPT2Config, compile_attention, compile_lm
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.model.checkpoint import Checkpoint
from max_gpt2.testing import random_attention_weights, write_checkpoint
from tests.support import LM, die_with_parent, serving_missing

SERVER = pytest.StashKey[ServerProcess]()
BACKGROUND = pytest.StashKey[list[subprocess.Popen]]()
SCRATCH = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM ends the session as Ctrl-C does, so `pytest_sessionfinish` stops what it started.

    (Python's default for SIGTERM is to die at once. Should even this be skipped,
    by SIGKILL, the server's watchdog and the prewarm's parent-death signal still end them.)
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the server and the prewarm compiles, if the collected tests need them."""
    scratch = session.config.stash[SCRATCH] = Path(tempfile.mkdtemp(prefix="max-gpt2-tests-"))
    session.config.stash[BACKGROUND] = []
    if (
        any("served_lm" in getattr(item, "fixturenames", ()) for item in session.items)
        and not serving_missing()
    ):
        checkpoint = write_checkpoint(scratch / "served", LM, seed=0, tokenizer=True)
        server = ServerProcess(checkpoint, scratch / "server.log", free_port(), "--device", "cpu")
        session.config.stash[SERVER] = server
    if os.environ.get("MAX_GPT2_PREWARM") == "1":
        with (scratch / "prewarm.log").open("w") as log:
            prewarm = subprocess.Popen(
                [sys.executable, "-m", "tests.prewarm"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                preexec_fn=die_with_parent,
            )
        session.config.stash[BACKGROUND].append(prewarm)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stops whatever `pytest_collection_finish` started, whatever happened."""
    if SERVER in session.config.stash:
        session.config.stash[SERVER].stop()
    for process in session.config.stash.get(BACKGROUND, []):
        process.kill()
        process.wait()
    if SCRATCH in session.config.stash:
        shutil.rmtree(session.config.stash[SCRATCH], ignore_errors=True)


@pytest.fixture(scope="session")
def served_lm(request) -> ServerProcess:
    """The server started at collection, ready: LM's seed-0 checkpoint with its tokenizer, on CPU."""
    server = request.config.stash[SERVER]
    server.wait_until_ready(timeout=1800)  # three fresh compiles on a busy 2-core machine
    return server


Compiler = Callable[..., CompiledAttention]


@pytest.fixture(scope="session")
def compiled() -> Compiler:
    """`compiled(config, dtype="float32", device="cpu", impl="graph")`: a shared graph, seed-0 weights."""
    build = functools.cache(
        lambda config, dtype, device, impl: compile_attention(
            config, random_attention_weights(config), device, dtype, impl
        )
    )

    def get(
        config: GPT2Config, dtype: str = "float32", device: str = "cpu", impl: str = "graph"
    ) -> CompiledAttention:
        return build(config, dtype, device, impl)  # one key however the arguments were passed

    return get


@pytest.fixture(scope="session")
def lm_checkpoint(tmp_path_factory) -> Callable[..., Path]:
    """`lm_checkpoint(config, seed=0)`: a seeded checkpoint directory with a tokenizer, written once."""
    written: dict[tuple[GPT2Config, int], Path] = {}

    def get(config: GPT2Config, seed: int = 0) -> Path:
        if (config, seed) not in written:
            directory = tmp_path_factory.mktemp(f"lm-{config.n_layer}x{config.n_embd}-seed{seed}")
            with_text = config.vocab_size > 256  # room for a byte-level tokenizer
            written[config, seed] = write_checkpoint(directory, config, seed, tokenizer=with_text)
        return written[config, seed]

    return get


@pytest.fixture(scope="session")
def lm_weights(lm_checkpoint) -> Callable[..., dict[str, np.ndarray]]:
    """`lm_weights(config, seed=0)`: that checkpoint's parameters, through the weights adapter."""
    return lambda config, seed=0: Checkpoint(lm_checkpoint(config, seed)).model_weights()


@pytest.fixture(scope="session")
def compiled_lm(lm_weights) -> Callable[..., CompiledLM]:
    """`compiled_lm(config, dtype="float32", device="cpu", weights="float32", kv_cache=None)`: a shared
    compiled model, seed-0 weights, its projections and head stored in the `weights` format, its KV
    cache in `kv_cache` (None: the format's default, `default_kv_cache`)."""
    build = functools.cache(
        lambda config, dtype, device, weights, kv_cache: compile_lm(
            config, lm_weights(config), device, dtype, weight_format=weights, kv_cache=kv_cache
        )
    )

    def get(
        config: GPT2Config,
        dtype: str = "float32",
        device: str = "cpu",
        weights: str = "float32",
        kv_cache: str | None = None,
    ) -> CompiledLM:
        return build(config, dtype, device, weights, kv_cache)

    return get
