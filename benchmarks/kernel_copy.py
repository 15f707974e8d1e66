"""An edited copy of `max_gpt2/kernels` loaded beside ours in one process (`kernel_ab.py`).

The copy's `*.mojo` files are written to a package of their own with every
`@extensibility.register("op")` renamed `"op_b"`, so MAX loads both: the copy's ops by name in a
graph of products, or a whole `CompiledLM` whose custom ops are all taken from the copy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import max_gpt2.kernels.ops
from max_gpt2.inference.lm import CompiledLM
from max_gpt2.inference.loading import load_lm

SUFFIX = "_b"


def renamed_copy(kernels: Path, into: Path, suffix: str = SUFFIX) -> Path:
    """The `*.mojo` files of `kernels` in `into/variant`, every registered op's name ending in `suffix`.

    A package directory of its own: compiled from `into` itself (a temporary directory that then
    also held the `.mojoc`), the package built but graphs failed with "unable to locate module"."""
    sources = sorted(kernels.glob("*.mojo"))
    if not sources:
        raise SystemExit(f"kernel_ab: {kernels} holds no .mojo files")
    package = into / "variant"
    package.mkdir()
    for source in sources:
        text = re.sub(r'register\("(\w+)"\)', rf'register("\1{suffix}")', source.read_text())
        (package / source.name).write_text(text)
    return package


class VariantOps:
    """The functional API `max_gpt2.kernels.ops` stages our ops with, every custom op taken from `package`
    under its renamed name; everything else passes through."""

    def __init__(self, functional: Any, package: Path) -> None:
        self._functional, self._package = functional, package
        self.custom, self.inplace_custom = (
            self._renamed(functional.custom),
            self._renamed(functional.inplace_custom),
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._functional, name)

    def _renamed(self, stage: Callable[..., Any]) -> Callable[..., Any]:
        def stage_variant(name: str, *args: Any, **options: Any) -> Any:
            return stage(name + SUFFIX, *args, **{**options, "custom_extensions": self._package})

        return stage_variant


def load_variant_lm(checkpoint: Path, weight_format: str, package: Path) -> CompiledLM:
    """`load_lm` with the kernels of `package` (a `renamed_copy`, compiled) in place of ours.

    Its caches are `package`'s directory: graphs kept under ours are keyed by our package's sources,
    not the copy's, and would run our kernels under the variant's name."""
    functional = max_gpt2.kernels.ops.F
    max_gpt2.kernels.ops.F = VariantOps(functional, package)
    try:
        return load_lm(checkpoint, device="cpu", weight_format=weight_format, cache_dir=package.parent)
    finally:
        max_gpt2.kernels.ops.F = functional
