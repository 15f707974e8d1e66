"""Shared fixtures.

Compiling a new graph costs about 45 s (attention) to 100 s (a whole model) on a
2-core machine, so every test gets its compiled attention or language model from
one session-wide cache, keyed by what makes the graph (config, dtype, device,
impl), and binds its own weights with `with_weights` (milliseconds). A clean
`make test` compiles on CPU: attention for GPT-2 small's and the odd layout
(float32, bfloat16 and flash for the latter), the two language models (a prompt
graph and a decoding-step graph each, compiled as one module), both with packed
weights (one graph each a format and cache, tests/test_weight_formats.py,
test_bench_generate.py and test_serve_weights.py), the attention-weights variants of the odd attention and
of LM (tests/test_heads.py), the Mojo ops alone (tests/test_kernels.py and
test_decode_layer.py: seven small graphs as one module, tests/op_graphs.py), and for the
serving tests three servers' paged-cache graphs (float32 and q4_0 weights, and LM
with 512 positions, three each, compiled as one module), MAX's sampler and
`ragged_positions` alone.

MAX compiles on little more than one core, so on a fresh 2-core machine the
session starts the slow work later tests need in other processes as soon as the
tests are collected: the servers the serving tests talk to (`SERVED`: each
compiles its own graphs), and, when `MAX_GPT2_PREWARM=1` (`make test` sets
it), `tests/prewarm.py`, which fills MAX's cache from the last graph the suite
needs while the tests compile from the first.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
from max.engine import Model

from max_gpt2 import CompiledAttention, CompiledLM, GPT2Config, cli, compile_attention, compile_lm
from max_gpt2.bench.server import ServerProcess, free_port, stop_group
from max_gpt2.explorer.app import ExplorerApp
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.testing import random_attention_weights, write_checkpoint
from tests import op_graphs
from tests.llama_cpp import llama_server_on
from tests.support import LM, LM_PAGES, die_with_parent, serving_missing

SERVERS = pytest.StashKey[dict[str, ServerProcess]]()


class Served(NamedTuple):
    """A server tests may ask for: `max-gpt2 serve` with `options` and `api_key` on the seed-0 checkpoint
    of `config` with a tokenizer (`from_gguf`: converted to an F32 GGUF file)."""

    options: tuple[str, ...]
    api_key: str | None = None
    from_gguf: bool = False
    config: GPT2Config = LM


# The servers tests may ask for, by fixture, each started at collection only where a collected test
# uses its fixture. The first decodes `DECODE_STEPS` tokens a scheduler step (the default), drafting
# up to 8 by prompt lookup, serves the head explorer, renders chats with the checkpoint's own template
# (`CHAT_TEMPLATE`), and sends whatever it would send off the machine to `TELEMETRY`'s listener; the
# second decodes 3 from a GGUF file quantized to q4_0, without drafts, answers to two names, lets one
# origin call it, and has no chat template; the third serves LM_PAGES, whose prompts span MAX's
# 128-token pages, to 4 requests a step (a cache of 4 * 512 / 128 pages: prefix reuse and eviction);
# the fourth serves LM's embeddings, each text's mean state, 4 texts a step.
SERVED = {
    "served_lm": Served(("--explorer", "--prompt-lookup", "8")),
    "served_q4_0_lm": Served(
        (
            "--weight-format", "q4_0", "--decode-steps", "3", "--served-model-name", "gpt2", "gpt2-q4",
            "--allowed-origins", "http://page.example",
        ),
        api_key="test-key",
        from_gguf=True,
    ),
    "served_pages_lm": Served(("--max-batch-size", "4", "--chat-template", "chatml"), config=LM_PAGES),
    "served_embeddings_lm": Served(("--embeddings", "--pooling", "mean", "--max-batch-size", "4")),
}  # fmt: skip
# The served checkpoint's own chat template (its tokenizer_config.json's `chat_template`).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
BACKGROUND = pytest.StashKey[list[subprocess.Popen]]()
SCRATCH = pytest.StashKey[Path]()
TELEMETRY = pytest.StashKey["Listener"]()


class Listener:
    """A TCP listener on the loopback that records every connection made to it (the first bytes each
    sent): where a server's proxy and telemetry endpoint point, so that what it would send off the
    machine arrives here instead."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.received: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:  # closed
                return
            with connection:
                connection.settimeout(5)
                try:
                    self.received.append(connection.recv(4096))
                except OSError:
                    self.received.append(b"")

    def environment(self) -> dict[str, str]:
        """Variables that send a process's HTTP(S) and OpenTelemetry traffic here."""
        names = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "OTEL_EXPORTER_OTLP_ENDPOINT")
        return {**dict.fromkeys(names, self.url), "NO_PROXY": "", "no_proxy": ""}


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM ends the session as Ctrl-C does, so `pytest_sessionfinish` stops what it started.

    (Python's default for SIGTERM is to die at once. Should even this be skipped,
    by SIGKILL, the server's watchdog and the prewarm's parent-death signal still end them.)
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (`pytest -m gpu -n 10 --dist loadgroup`), the accelerator tests that share a
    compiled graph run in one process, so each graph compiles once, beside the others."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            params = getattr(getattr(item, "callspec", None), "params", {})
            graph = "-".join(str(params[key]) for key in ("config", "dtype", "impl") if key in params)
            item.add_marker(
                pytest.mark.xdist_group(graph if "config" in params else item.nodeid.split("[")[0])
            )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the servers and the prewarm compiles, if the collected tests need them."""
    scratch = session.config.stash[SCRATCH] = Path(tempfile.mkdtemp(prefix="max-gpt2-tests-"))
    session.config.stash[BACKGROUND] = []
    servers = session.config.stash[SERVERS] = {}
    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ()) if name in SERVED}
    telemetry = session.config.stash[TELEMETRY] = Listener()
    if wanted and not serving_missing():
        for name in sorted(wanted):
            port = free_port()
            while port in (server.port for server in servers.values()):  # free, but perhaps not yet bound
                port = free_port()
            log = scratch / f"{name}.log"
            spec = SERVED[name]
            served = served_checkpoint(scratch, spec.config, spec.from_gguf)
            env = telemetry.environment() if name == "served_lm" else None
            servers[name] = ServerProcess(
                served, log, port, "--device", "cpu", *spec.options, api_key=spec.api_key, env=env
            )
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


def served_checkpoint(scratch: Path, config: GPT2Config, as_gguf: bool) -> Path:
    """The seed-0 checkpoint of `config` with a tokenizer (LM's with its chat template too), or it as an
    F32 GGUF file with no tokenizer file beside it (the file's own), written once in `scratch`."""
    directory = scratch / f"served-{config.n_positions}"
    if not directory.exists():
        write_checkpoint(directory, config, seed=0, tokenizer=True)
        if config == LM:
            (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    if not as_gguf:
        return directory
    gguf_file = scratch / f"served-{config.n_positions}-gguf" / "lm.gguf"
    if not gguf_file.exists():
        gguf_file.parent.mkdir()
        with contextlib.redirect_stderr(io.StringIO()):  # its progress lines
            assert cli.main(["convert", "--checkpoint", str(directory), "--out", str(gguf_file)]) == 0
    return gguf_file


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stops whatever `pytest_collection_finish` started, whatever happened."""
    for server in session.config.stash.get(SERVERS, {}).values():
        server.stop()
    if TELEMETRY in session.config.stash:
        session.config.stash[TELEMETRY].socket.close()
    for process in session.config.stash.get(BACKGROUND, []):
        process.kill()
        process.wait()
    if SCRATCH in session.config.stash:
        shutil.rmtree(session.config.stash[SCRATCH], ignore_errors=True)


def ready_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The server started at collection for the asking fixture, once it answers (skipped, saying why,
    where MAX's serving extra is missing and none was started)."""
    if missing := serving_missing():
        pytest.skip(f"MAX's serving extra is not installed ({', '.join(missing)})")
    server = request.config.stash[SERVERS][request.fixturename]
    server.wait_until_ready(timeout=1800)  # three fresh compiles on a busy 2-core machine
    return server


@pytest.fixture(scope="session")
def served_lm(request) -> ServerProcess:
    """`max-gpt2 serve --explorer --prompt-lookup 8` on LM's seed-0 checkpoint with its tokenizer and chat
    template, on CPU, float32, its traffic off the machine sent to `telemetry_listener`."""
    return ready_server(request)


@pytest.fixture(scope="session")
def served_model(compiled_lm, served_lm) -> CompiledLM:
    """LM compiled here with `served_lm`'s own weights: what the server's answers must be."""
    return compiled_lm(LM).with_weights(Checkpoint(served_lm.checkpoint).model_weights())


@pytest.fixture(scope="session")
def served_tokenizer(served_lm):
    """`served_lm`'s tokenizer, read here from its checkpoint."""
    from max_gpt2.inference.tokenizer import load_tokenizer

    return load_tokenizer(served_lm.checkpoint)


@pytest.fixture(scope="session")
def telemetry_listener(request) -> Listener:
    """The listener `served_lm`'s proxy and telemetry endpoint point at."""
    return request.config.stash[TELEMETRY]


@pytest.fixture(scope="session")
def served_pages_lm(request) -> ServerProcess:
    """`max-gpt2 serve --max-batch-size 4 --chat-template chatml` on LM_PAGES's seed-0 checkpoint with its
    tokenizer: prefix caching on (the default), a cache of 16 pages."""
    return ready_server(request)


@pytest.fixture(scope="module")
def llama_server(served_lm, tmp_path_factory):
    """llama.cpp's llama-server (`LLAMA_CPP`; the test skips without it) on `served_lm`'s weights, as the
    GGUF file `max-gpt2 convert` writes, one slot."""
    directory = tmp_path_factory.mktemp("llama-server")
    process, url = llama_server_on(served_lm.checkpoint, directory, "-c", str(LM.n_positions), "-np", "1")
    try:
        yield SimpleNamespace(url=url)
    finally:
        stop_group(process.pid, process.poll)


@pytest.fixture(scope="session")
def served_embeddings_lm(request) -> ServerProcess:
    """`max-gpt2 serve --embeddings --pooling mean --max-batch-size 4` on LM's seed-0 checkpoint."""
    return ready_server(request)


@pytest.fixture(scope="session")
def served_q4_0_lm(request) -> ServerProcess:
    """The same checkpoint as an F32 GGUF file, served with its projections and head in q4_0
    (`--weight-format q4_0`), up to 3 tokens a scheduler step (`--decode-steps 3`), answering only
    requests with its API key, to the names gpt2 and gpt2-q4, to pages of http://page.example too."""
    return ready_server(request)


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
    cache in `kv_cache` (None: the format's default, `WeightFormat.cache_dtype`)."""
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


@pytest.fixture(scope="session")
def explorer_app(lm_checkpoint) -> ExplorerApp:
    """The head explorer of LM's seed-0 checkpoint with its tokenizer, on CPU (`ExplorerApp.load`)."""
    return ExplorerApp.load(str(lm_checkpoint(LM)), "cpu")


@pytest.fixture(scope="session")
def compiled_ops() -> dict[str, Model]:
    """The Mojo ops each in a graph of its own, compiled as one module (`tests/op_graphs.py`): graph name
    -> model. One module took 36 s against 110 s for the seven graphs apart (2-core Zen 4, MAX's cache
    empty)."""
    return op_graphs.compile_ops()
