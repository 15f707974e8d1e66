"""Compiled graphs kept on disk as MAX artifacts (`.mef`), so a later process binds them without tracing.

MAX caches compiled graphs too, but finding its entry means tracing the graph (building the
modules and staging some 60 custom ops) and hashing it: seconds, every process. The
artifact MAX compiled is exported here once (`CompiledModel.export_mef`) and read back
(`max.engine.read`) by every later load that would trace the same graphs:

    CACHE/graphs/KEY.mef     the artifact: every variant compiled together
    CACHE/graphs/KEY.json    the graph name of each variant in it, written first

KEY is a hash of what makes the graphs: the caller's identity (config, device, dtype,
weight format, KV cache, the variants), the sources they are made from (`GRAPH_SOURCES`), MAX's
version and the CPU's model and features (MAX compiles for the host's instructions). An
artifact MAX cannot read is compiled again and replaced. Files are renamed into place whole.
"""

from __future__ import annotations

import hashlib
import json
import platform
from functools import cache
from pathlib import Path
from typing import Any

from max import engine

from max_gpt2.outputs import write_atomically

PACKAGE = Path(__file__).resolve().parents[1]
GRAPH_SOURCES = (
    "model/*.py",
    "kernels/*.py",
    "kernels/*.mojo",
    "inference/lm_graphs.py",
    "inference/lm_trace.py",
    "inference/devices.py",
)
"""What the graphs are made from: the modules, the kernels and the staging of the variants."""


@cache
def environment_digest() -> str:
    """What every artifact depends on besides its graphs: the sources they are made from, MAX's version,
    the CPU."""
    digest = hashlib.sha256(engine.__version__.encode())
    for file in sorted(file for pattern in GRAPH_SOURCES for file in PACKAGE.glob(pattern)):
        digest.update(str(file.relative_to(PACKAGE)).encode() + b"\0" + file.read_bytes())
    digest.update(_cpu().encode())
    return digest.hexdigest()


def _cpu() -> str:
    """The CPU's model and instruction-set features (Linux's /proc/cpuinfo), else what Python knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(dict.fromkeys(line for line in lines if line.split(":")[0].strip() in wanted))


class ArtifactCache:
    """Artifacts of one set of graphs (`identity`: JSON-serialisable, what makes them) in `directory`."""

    def __init__(self, directory: Path, identity: dict[str, Any]) -> None:
        self.directory, self.identity = directory, identity

    def _files(self, variants: list[str]) -> tuple[Path, Path]:
        text = json.dumps({**self.identity, "variants": variants}, sort_keys=True)
        key = hashlib.sha256((text + environment_digest()).encode()).hexdigest()[:32]
        return self.directory / f"{key}.mef", self.directory / f"{key}.json"

    def holds(self, variants: list[str]) -> bool:
        """Whether an artifact of `variants` is kept (`load` may still find it unreadable)."""
        return all(file.is_file() for file in self._files(variants))

    def load(self, variants: list[str]) -> tuple[engine.CompiledModel, dict[str, str]] | None:
        """The artifact holding `variants`, compiled together, and each one's graph name; None if none
        is kept or MAX cannot read it."""
        artifact, names = self._files(variants)
        try:
            graph_names = json.loads(names.read_text())
            return engine.read(artifact), {variant: graph_names[variant] for variant in variants}
        except (OSError, ValueError, KeyError, TypeError, RuntimeError):
            return None

    def save(self, variants: list[str], artifact: engine.CompiledModel, graph_names: dict[str, str]) -> None:
        """Keeps `artifact` (holding `variants`, each under its graph name) for later processes; a cache
        that cannot be written is left alone."""
        mef, names = self._files(variants)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomically(names, lambda partial: partial.write_text(json.dumps(graph_names)))
            write_atomically(mef, lambda partial: artifact.export_mef(partial))
        except OSError:
            pass
