"""`max-gpt2 bench-startup`'s measuring and reporting, on small stand-ins (no timed assertion)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from max_gpt2.bench.startup import Contender, contenders, format_table, ratios, run_once


def test_a_childs_peak_memory_is_its_own():
    """A child that holds 300 MB reports at least that, one that holds little far less."""
    big = Contender(
        "directory",
        "float32",
        [sys.executable, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
    )
    small = Contender("directory", "float32", [sys.executable, "-c", "pass"])
    (_, big_peak), (_, small_peak) = run_once(big), run_once(small)
    assert big_peak >= 300 and small_peak < 100


def test_a_failing_command_is_named_with_its_error():
    failing = Contender("gguf", "q4_0", [sys.executable, "-c", "import sys; sys.exit('no such model')"])
    with pytest.raises(RuntimeError, match=r"failed \(1\):\nno such model"):
        run_once(failing)


def test_ours_and_llama_cpp_read_the_same_file():
    found = contenders(Path("ckpt"), Path("w-q8_0.gguf"), "q8_0", Path("llama-completion"), 2)
    assert [c.source for c in found] == ["directory", "gguf", "llama.cpp"]
    assert found[0].command[-4:] == ["--checkpoint", "ckpt", "--weight-format", "q8_0"]
    assert found[1].command[-2:] == ["--checkpoint", "w-q8_0.gguf"]
    assert found[2].command == [
        "llama-completion",
        "-m",
        "w-q8_0.gguf",
        "-p",
        "The cat",
        "-n",
        "1",
        "-t",
        "2",
    ]
    assert [c.source for c in contenders(Path("c"), Path("g"), "q4_0", None, 2)] == ["directory", "gguf"]


def test_ratios_are_medians_of_each_rounds_own():
    """Round by round: 2/1, 1/2, 3/1 seconds -> median 2.0 (not 6/4 = 1.5 of the medians' ratio)."""
    rows = [
        {
            "source": "directory",
            "weight_format": "q4_0",
            "seconds": [2.0, 1.0, 3.0],
            "peak_mb": [200, 210, 220],
        },
        {
            "source": "llama.cpp",
            "weight_format": "q4_0",
            "seconds": [1.0, 2.0, 1.0],
            "peak_mb": [100, 100, 110],
        },
    ]
    found = ratios(rows)
    assert found == {"q4_0": {"directory": {"seconds": 2.0, "peak_mb": 2.0}}}
    report = {
        "checkpoint": "c",
        "rounds": 3,
        "load": [0.5, 0.7],
        "lscpu": {"Model name": "X"},
        "rows": rows,
        "ratios": found,
    }
    table = format_table(report)
    assert "| q4_0 | directory | 2.00 | 210 | 2.00 | 2.00 |" in table
    assert (
        "| q4_0 | llama.cpp | 1.00 | 100 | - | - |" in table
        and "load average 0.50 before, 0.70 after" in table
    )
