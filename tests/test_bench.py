"""`max-gpt2 bench`: runs every contender, checks them, writes JSON (and a plot when it can).

Only mechanics and bookkeeping are tested here; no timing is asserted. The
shapes are tiny and the model is the test suite's ODD layout, whose graphs the
other tests compile anyway (MAX's cache makes these compiles cheap).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import max_gpt2.kernels.ops
from max_gpt2.bench import harness
from max_gpt2.bench.attention import attention_flops
from max_gpt2.cli import main
from max_gpt2.kernels import MOJO_PACKAGE
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.layers import gpt2
from max_gpt2.model.layers.kernel_layers import block_for
from tests.support import ODD

MODEL = f"{ODD.n_embd}x{ODD.n_head}"
OURS = "graph,flash,numpy"  # wrapper works the same way; its graph is one compile more


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Runs the benchmark once per distinct argument list; returns (exit code, stdout, report)."""
    results = {}

    def invoke(*extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict]:
        if extra not in results:
            output = tmp_path_factory.mktemp("bench")
            argv = [
                "bench",
                "--device",
                "cpu",
                "--models",
                MODEL,
                "--no-cold-compile",
                "--output",
                str(output),
            ]
            code = main([*argv, "--shapes", "1x3,2x9", "--repeat", "2", *extra])
            report_path = output / "bench-cpu-float32.json"
            report = json.loads(report_path.read_text()) if report_path.exists() else {}
            results[extra] = (code, capsys.readouterr().out, report, output)
        return results[extra]

    return invoke


def test_every_contender_is_timed_and_checked(run, capsys):
    code, out, report, _ = run("--impls", OURS, capsys=capsys)
    assert code == 0
    rows = report["results"]
    assert {(r["impl"], r["batch"], r["seq_len"]) for r in rows} == {
        (impl, batch, seq) for impl in OURS.split(",") for batch, seq in ((1, 3), (2, 9))
    }
    for row in rows:
        assert row["matches_reference"], row
        assert 0 < row["min_seconds"] <= row["seconds"]
        assert row["tokens_per_second"] == pytest.approx(row["batch"] * row["seq_len"] / row["seconds"])
        assert row["speedup_vs_sdpa"] is None  # PyTorch was not asked for
    assert report["peak_gflops"] > 0 and report["machine"]["cores"] >= 1
    assert set(report["compile"][MODEL]) == {"graph", "flash"}
    assert "| impl | median ms | best ms | tokens/s | GFLOP/s | % of peak | vs SDPA |" in out


def test_plot_is_drawn_or_the_reason_given(run, capsys):
    _, out, _, output = run("--impls", OURS, capsys=capsys)
    if importlib.util.find_spec("matplotlib") is None:
        assert "plot skipped: matplotlib is not installed" in out
    else:
        assert (output / "bench-cpu-float32.png").read_bytes().startswith(b"\x89PNG")


def test_missing_pytorch_is_reported_not_fatal(run, capsys, monkeypatch):
    monkeypatch.setattr(harness, "optional_torch", lambda: None)  # what every PyTorch lookup calls
    code, out, report, _ = run("--impls", "graph,torch-sdpa", capsys=capsys)
    assert code == 0
    assert report["skipped"] == {"torch-sdpa": "PyTorch is not installed (pip install 'max-gpt2[peers]')"}
    assert {row["impl"] for row in report["results"]} == {"graph"}
    assert "skipped torch-sdpa: PyTorch is not installed" in out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--shapes", "1x0", "--shapes wants a list such as '1x128,8x256'"),
        ("--shapes", "128", "--shapes wants a list"),
        ("--models", "tiny", "--models takes names from small, medium, large, xl or WIDTHxHEADS"),
        ("--models", "10x3", "must be divisible"),
        ("--impls", "graph,fast", "--impls takes a list from graph, flash, wrapper"),
    ],
)
def test_bad_options_exit_2_naming_the_option(flag, value, message, capsys, tmp_path):
    code = main(["bench", "--device", "cpu", "--output", str(tmp_path), flag, value])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


def test_flops_count_projections_and_the_unmasked_pairs():
    config = GPT2Config(n_embd=4, n_head=2)  # head_dim 2
    projections = 2 * 1 * 3 * 4 * (12 + 4)  # batch 1, seq 3: c_attn [4 -> 12], c_proj [4 -> 4]
    attention = 2 * 2 * 1 * 2 * 2 * 6  # QK^T and PV, 2 heads of 2, 6 = 3 * 4 / 2 causal pairs
    assert attention_flops(config, batch=1, seq_len=3) == projections + attention


def is_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet (a container's init may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith(("Z", "X"))
    except (FileNotFoundError, IndexError):
        return True


def test_the_watchdog_ends_the_servers_group_once_its_starter_is_gone(tmp_path):
    """Why a killed test run leaves no server behind: a stand-in for the test process starts a
    process group (a `sleep` in place of the server and its workers) and the watchdog, as
    `ServerProcess` does, then dies by SIGKILL, which no handler sees; the group goes after it."""
    starter = """
import os, signal, subprocess, sys
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # the pipe to the test closes with us
group = subprocess.Popen(["sleep", "600"], start_new_session=True, **quiet)
command = [sys.executable, "-m", "max_gpt2.bench.server", "--watch", str(os.getpid()), str(group.pid)]
subprocess.Popen(command, start_new_session=True, env=dict(os.environ), **quiet)
print(group.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    result = subprocess.run(
        [sys.executable, "-c", starter], capture_output=True, text=True, env=dict(os.environ), timeout=60
    )
    assert result.returncode == -signal.SIGKILL
    server = int(result.stdout)
    deadline = time.monotonic() + 30  # the watchdog looks once a second, then SIGTERM
    while not is_gone(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert is_gone(server)


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module (the folder is not a package; its scripts import each other
    as they do when run from it)."""
    folder = Path(__file__).parent.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def load_kernel_ab():
    return load_benchmark("kernel_ab")


def test_serving_table_takes_each_ratio_within_a_round():
    """benchmarks/serving.py's rounds run the contenders in turn because the machine's speed moves
    between rounds: a ratio is the median of the same round's ratios, not a ratio of medians."""
    serving = load_benchmark("serving")

    def run(clients: int, rate: float) -> dict:
        latencies = {"median": 1000 / rate, "p95": 2000 / rate}
        return {
            "clients": clients,
            "tokens_per_second": rate,
            "requests_per_second": rate / 64,
            "ttft_ms": latencies,
            "itl_ms": latencies,
            "tpot_ms": {"median": 250 / rate, "p95": 500 / rate},
        }

    # Ours against llama-server per round: 30/20 = 1.5, 10/20 = 0.5, 22/20 = 1.1 (median 1.1, the
    # range shown). Ours against generate per round: 30/40 = 0.75, 10/10 = 1.0, 22/44 = 0.5: median
    # 0.75, where the ratio of the medians, 22/40, would be 0.55.
    rounds = [
        {
            "servers": {"max-gpt2 serve": [run(1, ours)], "llama-server": [run(1, 20.0)]},
            "in_process_tokens_per_second": {"1": generate},
        }
        for ours, generate in ((30.0, 40.0), (10.0, 10.0), (22.0, 44.0))
    ]
    lines = serving.table({"rounds": rounds, "clients": [1], "server_batch": 16}).splitlines()
    ours = next(line for line in lines if "| max-gpt2 serve |" in line)
    cells = [cell.strip() for cell in ours.split("|")[1:-1]]
    assert cells[2] == "22.0"  # the median tokens/s
    assert cells[3] == "0.75 (0.50-1.00) (x1: 40.0 tok/s)"
    assert cells[4] == "1.10 (0.50-1.50)"
    assert cells[8] == "11.4 / 22.7"  # the time a token at 22 tokens/s, median over the rounds
    llama = next(line for line in lines if "| llama-server |" in line)
    assert [cell.strip() for cell in llama.split("|")[1:-1]][4] == "-"


def test_kernel_ab_copies_the_kernels_with_every_op_renamed(tmp_path):
    """benchmarks/kernel_ab.py loads an edited copy of the kernels beside ours: the copy must register
    each of our ops under its own name (suffix `_b`) and change nothing else."""
    package = load_benchmark("kernel_copy").renamed_copy(MOJO_PACKAGE, tmp_path)
    assert package.parent == tmp_path  # its compiled package goes beside it, not inside
    sources = sorted(MOJO_PACKAGE.glob("*.mojo"))
    assert [copy.name for copy in sorted(package.glob("*.mojo"))] == [source.name for source in sources]
    registered = []
    for source in sources:
        original, copy = source.read_text(), (package / source.name).read_text()
        names = [line.split('"')[1] for line in original.splitlines() if "@extensibility.register(" in line]
        registered += names
        for name in names:
            assert f'register("{name}_b")' in copy and f'register("{name}")' not in copy
        assert copy.replace('_b")', '")') == original
    assert {"gpt2_matmul", "gpt2_dequantize", "gpt2_decode_layer"} <= set(registered)


def test_kernel_ab_stages_the_variants_ops_for_whole_steps(tmp_path):
    """`--steps` loads the model a second time staging every custom op from the copy, renamed, and
    leaves the rest of the functional API (and `max_gpt2.kernels.ops` afterwards) as it was."""
    kernel_copy = load_benchmark("kernel_copy")
    staged = []

    class Recording:
        def custom(self, name, device, inputs, outputs, custom_extensions=None):
            staged.append(("custom", name, custom_extensions))

        def inplace_custom(self, name, device, inputs, outputs, custom_extensions=None):
            staged.append(("inplace", name, custom_extensions))

        def constant(self, value):
            return value

    ops = kernel_copy.VariantOps(Recording(), tmp_path)
    ops.custom("gpt2_matmul", "cpu", [], [], custom_extensions=MOJO_PACKAGE)
    ops.inplace_custom("gpt2_cached_attention", "cpu", [], [], custom_extensions=MOJO_PACKAGE)
    assert staged == [
        ("custom", "gpt2_matmul_b", tmp_path),
        ("inplace", "gpt2_cached_attention_b", tmp_path),
    ]
    assert ops.constant(3) == 3
    functional = max_gpt2.kernels.ops.F
    with pytest.raises(Exception, match="missing"):
        kernel_copy.load_variant_lm(tmp_path / "missing", "float32", tmp_path)
    assert max_gpt2.kernels.ops.F is functional


def test_kernel_ab_alternates_which_goes_first_and_reports_the_pairs_spread():
    """Neither version always runs first, and the spread is the quartiles of the pairs' ratios."""
    kernel_ab = load_kernel_ab()
    assert kernel_ab.in_turn is harness.in_turn
    assert [harness.in_turn(["ours", "variant"], pair) for pair in range(3)] == [
        ["ours", "variant"],
        ["variant", "ours"],
        ["ours", "variant"],
    ]
    ours = [1.0, 2.0, 1.0, 4.0, 1.0]
    variant = [0.9, 2.2, 1.1, 4.0, 1.3]  # ratios 0.9, 1.1, 1.1, 1.0, 1.3
    assert kernel_ab.spread(ours, variant) == "0.950-1.200"


def test_kernel_ab_op_by_op_leaves_the_model_as_it_was(tmp_path):
    """`--op-by-op` builds its second model with `Block` in place of `KernelBlock`, and only it."""
    kernel_ab = load_kernel_ab()
    with pytest.raises(Exception, match="missing"):
        kernel_ab.load_op_by_op_lm(tmp_path / "missing", "q4_0")
    assert gpt2.block_for is block_for
