"""GPU graphs compiled ahead, on a machine without a GPU, and read on the lent one instead of compiled.

MAX 26.7 compiles for an accelerator it does not see through its virtual device
(`max.driver.set_virtual_device_*`), and keeps what it compiles in a store of artifacts named by
graph name and signature (`max.engine.MefStore`); a process that installs a store as
`InferenceSession.default_mef_store` reads each graph from it instead of compiling it
(`max_gpt2.inference.compiled.compile_together` asks the store). `precompile` writes the store
for the attention and LM stages; `build` reads from it and compiles where an artifact is missing
or refused, saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from max.engine import InferenceSession, MefStore

from gpu_proof.plan import Plan
from gpu_proof.record import Results, cpu_seconds
from max_gpt2 import compile_attention, compile_lm
from max_gpt2.model.parameters import model_parameter_shapes, parameter_shapes

T = TypeVar("T")
HOST_TARGET = "x86-64-v3"  # the host code's instructions: any x86-64 machine lent with a GPU runs them


def precompile(directory: Path, plan: Plan, architecture: str) -> None:
    """Compiles the attention and LM stages' graphs for `plan.device` into a store at `directory`: for an
    NVIDIA GPU of `architecture` through MAX's virtual device when `plan.device` is "gpu"."""
    if plan.device == "gpu":
        from max import driver

        driver.set_virtual_cpu_target(HOST_TARGET)
        driver.set_virtual_device_api("cuda")
        driver.set_virtual_device_target_arch(architecture)
        driver.set_virtual_device_count(1)
    InferenceSession.default_mef_store = MefStore.for_export(directory)
    jobs: list[tuple[str, Callable[[], Any]]] = [
        (
            f"attention n_embd={c.n_embd} {dtype}",
            lambda c=c, d=dtype: compile_attention(c, zeros(parameter_shapes(c)), plan.device, d, "auto"),
        )
        for dtype in ("float32", "bfloat16")
        for c in plan.attention
    ]
    jobs += [
        (f"lm {d}", lambda d=d: compile_lm(plan.lm, zeros(model_parameter_shapes(plan.lm)), plan.device, d))
        for d in plan.dtypes
    ]
    for what, job in jobs:
        start = time.perf_counter()
        job()
        print(f"compiled {what} for {plan.device} {architecture} in {time.perf_counter() - start:.1f} s")
    files = list(directory.iterdir())
    size = sum(file.stat().st_size for file in files)
    print(f"{directory}: {len(files)} files, {size / 2**20:.1f} MiB", flush=True)


def use(directory: Path | None) -> None:
    """Reads graphs from the store at `directory` from now on in this process (None: compiles them)."""
    InferenceSession.default_mef_store = None if directory is None else CountingStore.read(directory)


class CountingStore:
    """A store for import that counts the artifacts claimed from it: whether a load read one."""

    @staticmethod
    def read(directory: Path) -> MefStore:
        store = MefStore.for_import(directory)
        claim = store.claim_import

        def counted(graph: Any) -> Path | None:
            found = claim(graph)
            store.claimed = getattr(store, "claimed", 0) + (found is not None)
            return found

        store.claim_import = counted  # MAX's own lookup, counted
        return store


def build(results: Results, what: str, make: Callable[[], T]) -> T:
    """`make()` (a compile, or a load that compiles), recorded as `compile WHAT` with its time and how it
    got its graphs: read from this process's store, else compiled here (or found in a cache on disk).
    Where the store refuses an artifact a note says why, and the graph is compiled here."""
    store = InferenceSession.default_mef_store
    claimed, wall, cpu = getattr(store, "claimed", 0), time.perf_counter(), cpu_seconds()
    try:
        made = make()
    except Exception as error:  # MAX's MissingArtifactError, or an artifact this machine cannot load
        if store is None:
            raise
        results.record(f"precompiled {what}", "note", refused=first_line(error))
        InferenceSession.default_mef_store = None
        try:
            return results.timed(f"compile {what}", make, how="compiled here, the artifact refused")
        finally:
            InferenceSession.default_mef_store = store
    how = "precompiled" if getattr(store, "claimed", 0) > claimed else "compiled here or cached"
    wall, cpu = round(time.perf_counter() - wall, 1), round(cpu_seconds() - cpu, 1)
    results.record(f"compile {what}", "done", seconds=wall, cpu_seconds=cpu, how=how)
    return made


def compile_to_compare(results: Results, plan: Plan) -> None:
    """The first attention graph compiled here, the store set aside: what reading it saved."""
    store, InferenceSession.default_mef_store = InferenceSession.default_mef_store, None
    config = plan.attention[0]
    try:
        results.timed(
            f"compile attention n_embd={config.n_embd} float32 here too, to compare",
            lambda: compile_attention(
                config, zeros(parameter_shapes(config)), plan.device, "float32", "auto"
            ),
        )
    finally:
        InferenceSession.default_mef_store = store


def zeros(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Weights for a compile: bound after it, never compiled in."""
    return {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"
