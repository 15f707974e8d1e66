"""Our Mojo kernels compiled once into a `.mojoc` and kept, instead of once per op a graph stages.

Given a Mojo source directory as `custom_extensions`, MAX runs `mojo precompile`
on it each time an op names it (seconds each time), and a GPT-2 graph
stages some 60 of our ops: minutes of building before the (cached) compile. Given
a compiled package, MAX only loads it. The package is kept under the cache
directory, named by a hash of its sources and MAX's version, so an edited kernel
or another MAX compiles afresh; several processes may build it at once (each
writes its own staging copy and renames it into place).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from max import engine
from mojo.run import subprocess_run_mojo

from max_gpt2.outputs import default_cache_dir


def source_digest(sources: Path) -> str:
    """A hash of every `.mojo` file under `sources` (names and bytes) and of MAX's version."""
    digest = hashlib.sha256(engine.__version__.encode())
    for file in sorted(sources.rglob("*.mojo")):
        digest.update(str(file.relative_to(sources)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def compiled_package(sources: Path, cache: Path | None = None) -> Path:
    """`sources` (a directory with `__init__.mojo`) as a compiled `.mojoc`, built on first use.

    Raises `FileNotFoundError` naming `sources` if it is not a Mojo package, and
    `RuntimeError` with the compiler's message if it does not compile. Where the cache cannot be
    written, warns and returns `sources`, which MAX builds itself.
    """
    if not (sources / "__init__.mojo").is_file():
        raise FileNotFoundError(f"{sources} is not a Mojo package: it has no __init__.mojo")
    name = f"{sources.name}_{source_digest(sources)}"
    package = (cache or default_cache_dir() / "mojo") / f"{name}.mojoc"
    if package.is_file():
        return package
    # The compiler names the module after the output file, so the staged copy carries the final name.
    try:
        package.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=package.parent))
    except OSError as error:  # MAX builds the sources itself then, for every op a graph stages
        warnings.warn(
            f"cannot keep the compiled kernels in {package.parent} ({error}); building them from source "
            "as each graph compiles, minutes longer",
            stacklevel=2,
        )
        return sources
    try:
        subprocess_run_mojo(
            ["precompile", str(sources), "-o", str(staging / package.name)], capture_output=True, check=True
        )
        os.replace(staging / package.name, package)
    except subprocess.CalledProcessError as error:
        message = (error.stderr or b"").decode(errors="replace").strip()
        raise RuntimeError(f"mojo precompile {sources} failed:\n{message}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return package
