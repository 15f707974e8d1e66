"""What each kind of x86 CPU compiles the decoding kernels to, read from the assembly.

The kernels choose their instructions by CPU feature when they compile (AVX2 or AVX-512, VNNI,
AVX-512 BF16), and the rest of the suite runs only the choice this machine makes. Code can be
right everywhere and slow on one kind of CPU: bfloat16 vectors on a CPU without bfloat16
instructions once compiled to a library call a value (`__truncsfbf2`: 540 calls in this probe for
a Zen 3, 2132 for an Ice Lake Xeon), and bfloat16 decoded 10x slower there with every output
correct. So each test here builds `kernel_targets.mojo` (every weight format's decoding layer and
LM-head products) for one CPU of a kind with `mojo build --emit asm --target-cpu`, runs nothing,
and checks that the code calls no float16 or bfloat16 conversion routine and uses the
multiply-adds that kind of CPU has.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mojo.run import subprocess_run_mojo

PROBE = Path(__file__).with_name("kernel_targets.mojo")
KERNELS_PARENT = Path(__file__).parents[1] / "max_gpt2"
# A CPU of each kind the kernels tell apart, and the instructions its code must hold: float32
# multiply-adds and float16 conversions everywhere, then the byte products (vpmaddubsw without
# VNNI, vpdpbusd with it) and, with AVX-512 BF16, bfloat16 pairs.
TARGETS = {
    "znver3": ("vfmadd231ps", "vcvtph2ps", "vpmaddubsw"),  # AVX2 alone
    "skylake-avx512": ("vfmadd231ps", "vcvtph2ps", "vpmaddubsw"),  # AVX-512 without VNNI or BF16
    "icelake-server": ("vfmadd231ps", "vcvtph2ps", "vpdpbusd"),  # AVX-512 and VNNI without BF16
    "znver4": ("vfmadd231ps", "vcvtph2ps", "vpdpbusd", "vdpbf16ps"),  # both
}
# compiler-rt's software conversions (__truncsfbf2, __extendhfsf2, __gnu_h2f_ieee, ...).
LIBRARY_CONVERSION = re.compile(r"\bcall[a-z]*\s+(__(?:trunc|extend)\w+|__gnu_\w+_ieee)\b")


def _assembly(target: str, out: Path) -> str:
    """The probe's assembly for `target`, as `mojo build` writes it."""
    listing = out / f"{target}.s"
    build = ["build", "--emit", "asm", "--target-cpu", target, "-I", str(KERNELS_PARENT), str(PROBE)]
    try:
        subprocess_run_mojo([*build, "-o", str(listing)], capture_output=True, check=True)
    except subprocess.CalledProcessError as error:
        message = (error.stderr or b"").decode(errors="replace")[-4000:]
        pytest.fail(f"mojo build for {target} failed:\n{message}")
    return listing.read_text()


@pytest.fixture(scope="module")
def assembly(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each target's assembly of the probe (17-30 s a target on 2 cores, two at a time)."""
    out = tmp_path_factory.mktemp("kernel_targets")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(TARGETS, pool.map(lambda target: _assembly(target, out), TARGETS), strict=True))


@pytest.mark.parametrize("target", TARGETS)
def test_kernels_convert_floats_without_library_calls(assembly: dict[str, str], target: str) -> None:
    calls = LIBRARY_CONVERSION.findall(assembly[target])
    names = ", ".join(sorted(set(calls)))
    assert not calls, (
        f"{target}: the kernels call {names} ({len(calls)} calls): a value at a time in software"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_kernels_use_the_multiply_adds_the_cpu_has(assembly: dict[str, str], target: str) -> None:
    missing = [
        name for name in TARGETS[target] if not re.search(rf"^\s+{name}\b", assembly[target], re.MULTILINE)
    ]
    assert not missing, f"{target}: no {', '.join(missing)} in the kernels' code"
