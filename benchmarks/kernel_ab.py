"""A/B of a kernel change: a GPT-2 step's products through our kernels and through an edited copy.

    cp -r max_gpt2/kernels /tmp/try && $EDITOR /tmp/try/bf16_matmul.mojo
    python benchmarks/kernel_ab.py /tmp/try --weights bfloat16 --rows 1,8

On 2 cores the machine's memory speed moves between runs by 10-30 %, so two
runs cannot tell a few per cent apart. Here both versions load into one
process and are called in turn: the copy's `*.mojo` files are written to a
temporary package with every `@extensibility.register("op")` renamed
`"op_b"`, so MAX loads it beside `max_gpt2.kernels` (a variant compiles in
seconds). The graph is a decoding step's products (per layer: c_attn,
c_proj, c_fc, mlp c_proj; then the LM head), each weight distinct and in the
chosen format, each product taking the previous one's output as a step does:
independent products in one graph run concurrently and overstate bandwidth.
Prints each version's median milliseconds, the bytes of weights it streamed per
second, the ratio, and the largest difference between their outputs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, TensorType, ops

from max_gpt2.bench.generation import MODELS
from max_gpt2.bench.harness import machine_description
from max_gpt2.inference.devices import packed_buffer
from max_gpt2.kernels import MOJO_PACKAGE, matmul_op_name
from max_gpt2.model import weight_formats as wf
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.dtypes import float32_to_bfloat16_bits

CPU_REF = DeviceRef.CPU()
SUFFIX = "_b"


def renamed_copy(kernels: Path, into: Path, suffix: str = SUFFIX) -> Path:
    """The `*.mojo` files of `kernels` in `into`, every registered op's name ending in `suffix`."""
    sources = sorted(kernels.glob("*.mojo"))
    if not sources:
        raise SystemExit(f"kernel_ab: {kernels} holds no .mojo files")
    for source in sources:
        text = re.sub(r'register\("(\w+)"\)', rf'register("\1{suffix}")', source.read_text())
        (into / source.name).write_text(text)
    return into


def step_shapes(config: GPT2Config) -> list[tuple[int, int]]:
    """(N, K) of a decoding step's products in order: 4 a layer, then the LM head."""
    width, inner = config.n_embd, config.mlp_width
    layer = [(3 * width, width), (width, width), (inner, width), (width, inner)]
    return layer * config.n_layer + [(config.vocab_size, width)]


def stored(weight: np.ndarray, weights: str, bias: np.ndarray) -> list[np.ndarray]:
    """`weight` [N, K] as the kernel for `weights` takes it: the matrix, or values and scales, then
    the bias the packed kernels add (empty: none)."""
    if weights == "float32":
        return [weight]
    if weights == "bfloat16":
        return [float32_to_bfloat16_bits(weight), bias]
    values, scales = (wf.quantize_q8_0 if weights == "q8_0" else wf.quantize_q4_0)(weight)
    return [*wf.interleave(values, scales, weights), bias]


def step_graph(
    name: str,
    op: str,
    rows: int,
    width: int,
    shapes: list[tuple[int, int]],
    products: list[list[Buffer]],
    extensions: list[Path],
) -> Graph:
    """x [rows, width] through every product in turn -> the LM head's output."""
    types = [TensorType(DType.float32, [rows, width], CPU_REF)]
    types += [TensorType(b.dtype, b.shape, CPU_REF) for product in products for b in product]
    with Graph(name, input_types=types, custom_extensions=extensions) as graph:
        hidden, *weights = (value.tensor for value in graph.inputs)
        for (n, _), product in zip(shapes, products, strict=True):
            taken, weights = weights[: len(product)], weights[len(product) :]
            (y,) = ops.custom(op, CPU_REF, [hidden, *taken], [TensorType(DType.float32, [rows, n], CPU_REF)])
            hidden = y[:, :width] if n == 3 * width else y  # c_attn's output: its queries feed c_proj
        graph.output(y)
    return graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", type=Path, help="an edited copy of max_gpt2/kernels")
    parser.add_argument("--weights", default="float32", choices=wf.FORMATS)
    parser.add_argument("--rows", default="1,8", help="rows of x (batch), comma-separated (default: 1,8)")
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=30, help="timed calls of each (default: 30)")
    args = parser.parse_args()
    config = MODELS[args.model]
    shapes = step_shapes(config)
    op = matmul_op_name(args.weights)
    rng = np.random.default_rng(0)
    # Unit-variance outputs through the whole chain: weights ~ N(0, 1/K); the projections have
    # biases (zeros here), the head none.
    arrays = [
        stored(
            rng.standard_normal((n, k), np.float32) / np.float32(np.sqrt(k)),
            args.weights,
            np.zeros(0 if n == config.vocab_size else n, np.float32),
        )
        for n, k in shapes
    ]
    streamed = sum(a.nbytes for product in arrays for a in product)
    products = [[packed_buffer(a) for a in product] for product in arrays]
    weights = [buffer for product in products for buffer in product]
    session = InferenceSession(devices=[CPU()])
    print(machine_description(CPU()))
    print("| rows | ours ms | variant ms | ours GB/s | variant GB/s | variant / ours | max difference |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as temporary:
        variant = renamed_copy(args.variant, Path(temporary))
        extensions = [MOJO_PACKAGE, variant]
        for rows in (int(r) for r in args.rows.split(",")):
            models: dict[str, Model] = {
                name: session.load(
                    step_graph(
                        f"ab_{name}_{args.weights}_{rows}",
                        op + suffix,
                        rows,
                        config.n_embd,
                        shapes,
                        products,
                        extensions,
                    )
                )
                for name, suffix in (("ours", ""), ("variant", SUFFIX))
            }
            x = Buffer.from_numpy(rng.standard_normal((rows, config.n_embd), dtype=np.float32))
            outputs = {name: model.execute(x, *weights)[0].to_numpy() for name, model in models.items()}
            seconds: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(args.rounds):
                for name, model in models.items():
                    start = time.perf_counter()
                    model.execute(x, *weights)
                    seconds[name].append(time.perf_counter() - start)
            ours, theirs = (statistics.median(seconds[name]) for name in ("ours", "variant"))
            difference = float(np.abs(outputs["ours"] - outputs["variant"]).max())
            print(
                f"| {rows} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {streamed / ours / 1e9:.1f} | "
                f"{streamed / theirs / 1e9:.1f} | {theirs / ours:.3f} | {difference:.1e} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
