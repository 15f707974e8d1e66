"""llama.cpp's `llama-quantize` for the tests that compare with it, and the fixture of its blocks kept for CI.

The tool is found in `$LLAMA_CPP` (a build's `bin` directory) or on PATH; tests that need it skip
without. `python -m tests.llama_cpp` rewrites `tests/data/llama_quantize_blocks.npz`: `crafted_rows()`
quantized by llama-quantize into each of llama.cpp's other types, so that CI checks our quantizers
bit for bit without llama.cpp.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from max_gpt2 import GPT2Config
from max_gpt2.model.checkpoints.gguf_checkpoint import gguf_name
from max_gpt2.model.parameters import model_parameter_shapes

FIXTURE = Path(__file__).parent / "data" / "llama_quantize_blocks.npz"
TYPES = ["Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
# A GPT-2 whose ffn_down rows are 512 weights: two K-quant super-blocks, sixteen blocks of 32.
CARRIER = GPT2Config(n_embd=256, n_head=4, n_layer=1, n_positions=8, vocab_size=16, n_inner=512)
ROWS_AT = "transformer.h.0.mlp.c_proj.weight"


def llama_tool(name: str) -> Path | None:
    """llama.cpp's tool `name` from `$LLAMA_CPP` or PATH, or None."""
    directory = os.environ.get("LLAMA_CPP")
    if directory and (Path(directory) / name).is_file():
        return Path(directory) / name
    found = shutil.which(name)
    return Path(found) if found else None


def llama_server_on(checkpoint: str | Path, directory: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """llama-server (from `llama_tool`; the test skips without it) on `checkpoint` as the F32 GGUF file
    `max-gpt2 convert` writes into `directory`, with `-t 2` and `options`, in a process group of its own
    (`stop_group` ends it), its output in `directory`'s `llama-server-N.log`: the process and its URL, once
    it answers /health."""
    import pytest

    from max_gpt2.bench.server import free_port, wait_for_health
    from tests.support import run_python

    binary = llama_tool("llama-server")
    if binary is None:
        pytest.skip("needs llama.cpp's llama-server (set LLAMA_CPP to its build/bin)")
    gguf = directory / "lm.gguf"
    if not gguf.exists():
        converted = run_python("-m", "max_gpt2", "convert", "--checkpoint", checkpoint, "--out", gguf)
        assert converted.returncode == 0, converted.stderr
    port, log = free_port(), (directory / f"llama-server-{len(list(directory.glob('*.log')))}.log").open("w")
    command = [str(binary), "-m", str(gguf), "--port", str(port), "-t", "2", *options]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url, process, 120)
    return process, url


def crafted_rows() -> np.ndarray:
    """16 rows of 512 float32 weights that reach each branch of the quantizers: heavy tails, all-zero
    groups and super-blocks, constant runs, one-signed runs, huge and tiny scales, values on a grid."""
    rng = np.random.default_rng(75)
    rows = np.empty((16, 512), np.float32)
    rows[0] = rng.standard_t(3, 512) * 0.02
    rows[1] = rng.standard_normal(512) * 0.05
    rows[2] = rng.standard_normal(512) * 0.02
    rows[2, :256], rows[2, 300:316] = 0, 0  # a zero super-block, a zero group of 16
    rows[3] = np.repeat(np.array([0.5, -0.25, 0.0, 1e-3], np.float32), 128)
    rows[4] = -np.abs(rng.standard_normal(512)) * 0.03
    rows[5] = np.abs(rng.standard_normal(512)) * 0.03 + 1.0
    rows[6] = rng.standard_normal(512) * 100
    rows[7] = rng.standard_normal(512) * 1e-6
    rows[8] = rng.standard_normal(512) * 0.02
    rows[8, rng.integers(0, 512, 6)] = [2.5, -3.0, 1.75, -2.0, 4.0, -1.5]  # GPT-2's outliers
    rows[9] = rng.integers(-20, 20, 512) * 0.01
    rows[10:] = rng.uniform(-1, 1, (6, 512)) * np.logspace(-3, 1, 6)[:, None]
    return rows


def quantized_by_llama(tool: Path, rows: np.ndarray, kind: str) -> np.ndarray:
    """`rows` [n <= 256, 512] quantized by `llama-quantize --pure` into ggml type `kind`: uint8 blocks
    [n, row bytes], carried as the first rows of a small GPT-2's ffn_down."""
    from tests.gguf_files import gguf, write_typed_file

    values = {
        name: np.zeros(shape, np.float32) + (1.0 if len(shape) == 1 else 0.0)
        for name, shape in model_parameter_shapes(CARRIER).items()
    }
    values[ROWS_AT][: len(rows)] = rows
    with tempfile.TemporaryDirectory() as scratch:
        source, out = Path(scratch) / "f32.gguf", Path(scratch) / "out.gguf"
        write_typed_file(source, CARRIER, {}, np.random.default_rng(0), values)
        done = subprocess.run([tool, "--pure", source, out, kind], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(out).tensors}
        tensor = tensors[gguf_name(ROWS_AT)]
        assert tensor.tensor_type.name == kind
        return np.asarray(tensor.data).reshape(CARRIER.n_embd, -1)[: len(rows)].copy()


def main() -> None:
    tool = llama_tool("llama-quantize")
    if tool is None:
        raise SystemExit("llama-quantize not found: set LLAMA_CPP to llama.cpp's build/bin")
    rows = crafted_rows()
    blocks = {kind: quantized_by_llama(tool, rows, kind) for kind in TYPES}
    FIXTURE.parent.mkdir(exist_ok=True)
    np.savez_compressed(FIXTURE, weights=rows, **blocks)
    print(f"{FIXTURE}: {FIXTURE.stat().st_size} bytes")


if __name__ == "__main__":
    main()
