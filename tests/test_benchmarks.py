"""Every benchmark script still imports against the library (their runs are too long for the suite:
docs/performance.md has the commands), so a renamed function breaks a test, not the next measurement."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_each_benchmark_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as `python benchmarks/X.py` runs it: siblings import
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    if '__name__ == "__main__"' in script.read_text():  # a script, not a helper its siblings import
        assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
