"""Package attributes imported on first use, so a process imports only what it touches.

MAX's graph-building modules (`max.experimental`, `max.nn`) take about a second to import on a
small CPU, and a process that reads its compiled model from disk never needs them. A package
names what it exports and the module each comes from; `lazy_exports` gives it the module-level
`__getattr__` and `__dir__` (PEP 562) that import an attribute's module the first time it is asked for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose attribute `name` is `exports[name]`'s `name`."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)  # found directly from now on
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
