"""The package's layers, read from its imports: no module imports one from a layer above its own.

The library's packages stack up in `RANKS` (the shared helpers, the kernels, the model, the
compiled model and its uses, the server); each imports only from its own rank and below. The
tools (`analysis`, `explorer`, `cli`, `bench`) sit above the library, which never imports them:
`max-gpt2 serve`'s process (`cli/serve_process.py`) mounts the explorer on the server, not the
server itself. Inside `model` the same holds for its parts (`MODEL_RANKS`): what every part uses
(the Hub, the config, the parameters' names), then the weight formats, then the checkpoints and the
layers, which do not import each other. docs/architecture.md draws the same picture. Source only,
nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import max_gpt2

PACKAGE = Path(max_gpt2.__file__).parent
RANKS = {"outputs": 0, "lazy": 0, "max_internals": 0, "kernels": 1, "model": 2, "inference": 3, "serving": 4}
TOOLS = {"analysis", "explorer", "cli", "bench", "__main__"}
LIBRARY_MODULES = {"reference", "verify", "testing"}  # top-level modules of the library
MODEL_RANKS = {
    "hub": 0,
    "gpu_limits": 0,
    "config": 1,
    "parameters": 2,
    "formats": 3,
    "checkpoints": 4,
    "layers": 4,
}


def part_of(path: Path, root: Path = PACKAGE) -> str:
    """The package (or top-level module) under `root` of the package's file `path`."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else path.stem


def imported(path: Path, package: str = "max_gpt2") -> set[str]:
    """The packages and top-level modules of `package` that file `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        depth = package.count(".") + 1
        found |= {name.split(".")[depth] for name in names if name.startswith(package + ".")}
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    climbing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = part_of(path)
        for target in imported(path) - {own}:
            library = own in RANKS or own in LIBRARY_MODULES
            if library and target in TOOLS:
                climbing.append(
                    f"{path.relative_to(PACKAGE.parent)} (library) imports max_gpt2.{target} (a tool)"
                )
            elif own in RANKS and RANKS.get(target, -1) > RANKS[own]:
                climbing.append(
                    f"{path.relative_to(PACKAGE.parent)} ({own}) imports max_gpt2.{target}, above it"
                )
    assert not climbing, "\n".join(climbing)


def test_the_layer_check_sees_imports():
    """The check reads what it should: serving's imports name the layers below it."""
    serving = set().union(*(imported(path) for path in (PACKAGE / "serving").rglob("*.py")))
    assert {"model", "inference", "kernels"} <= serving


def test_no_part_of_the_model_imports_from_one_at_or_above_its_own():
    model = PACKAGE / "model"
    assert {part_of(path, model) for path in model.rglob("*.py")} - {"__init__"} == set(MODEL_RANKS)
    climbing = []
    for path in sorted(model.rglob("*.py")):
        own = part_of(path, model)
        if own == "__init__":
            continue
        for target in imported(path, "max_gpt2.model") - {own}:
            if MODEL_RANKS[target] >= MODEL_RANKS[own]:
                climbing.append(f"{path.relative_to(PACKAGE.parent)} ({own}) imports max_gpt2.model.{target}")
    assert not climbing, "\n".join(climbing)
