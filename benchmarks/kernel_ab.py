"""A/B of a kernel change: a GPT-2 step's products through our kernels and through an edited copy.

    cp -r max_gpt2/kernels /tmp/try && $EDITOR /tmp/try/skinny_matmul.mojo
    python benchmarks/kernel_ab.py /tmp/try --weight-format bfloat16 --rows 1,8

A small machine's memory speed moves between runs by tens of per cent, so two
runs cannot tell a few per cent apart. Here both versions load into one
process (`kernel_copy.py`: the copy's ops renamed, so MAX loads them beside
`max_gpt2.kernels`; a variant compiles in seconds) and are called in turn, which
of the two goes first alternating from one pair of calls to the next. The
graph is a decoding step's products (per layer: c_attn, c_proj, c_fc, mlp c_proj;
then the LM head), each weight distinct and in the chosen format, each product
taking the previous one's output as a step does: independent products in one
graph run concurrently and overstate bandwidth.
Prints each version's median milliseconds, the bytes of weights it streamed per
second, the ratio, the middle half of the ratios pair by pair (a spread that
straddles 1 says the pairs disagree on which is faster), and the largest
difference between their outputs.

    python benchmarks/kernel_ab.py /tmp/try --weight-format bfloat16 --rows 1 --part head

the same for the layers' products alone (`--part layers`) or the LM head's shape three
times (`--part head`: a big product, which streams nearer the memory's rate than a
layer's small ones).

    python benchmarks/kernel_ab.py /tmp/try --weight-format q4_0 --steps 1x32,8x100

times whole decoding steps instead (attention, MAX's ops and all): the
benchmark checkpoint loaded twice with `load_lm`, the second time with every
custom op the model stages taken from the copy, then for each BATCHxPOSITIONS
a prompt of that length and 39 steps of each model in turn, 4 rounds (`--rounds`); prints
median step milliseconds, the ratio and its pairs' middle half, and the largest
difference between the logits of their first steps. The copy's model keeps its graphs
and converted weights apart (graphs kept under ours are keyed by our sources).

    python benchmarks/kernel_ab.py /tmp/try --weight-format q6_k --model medium --steps 1x512 --prompts

the prompts of those shapes instead, one a round from each model in turn, and the
largest difference between their last logits.

    python benchmarks/kernel_ab.py --kv-cache float16 --weight-format q4_0 --steps 1x32,8x100

the same, our kernels both times, the first model keeping its KV cache in float32, the second in
float16 (elsewhere both keep the format's default: float16 beside packed weights).

    python benchmarks/kernel_ab.py --op-by-op --weight-format q4_0 --steps 1x32,8x32

the same, the first model's blocks one `gpt2_decode_layer` op each (as shipped), the
second's op by op (layer norms, products, attention, GELU and adds, each an op).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
from kernel_copy import SUFFIX, load_variant_lm, renamed_copy  # this folder's
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, TensorType, ops

from max_gpt2.bench.generation import MODELS, demo_checkpoint_for
from max_gpt2.bench.harness import in_turn, machine_description
from max_gpt2.inference.devices import packed_buffer
from max_gpt2.inference.lm import CompiledLM
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.threads import quiet_restless_threads
from max_gpt2.kernels import kernel_library
from max_gpt2.kernels.package import compiled_package
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FORMATS, TensorFormat
from max_gpt2.model.layers import gpt2
from max_gpt2.model.layers.block import Block
from max_gpt2.outputs import Progress, default_cache_dir

CPU_REF = DeviceRef.CPU()
STEPS, STEP_ROUNDS, PRODUCT_ROUNDS = 39, 4, 30


PARTS = ("step", "layers", "head")


def step_shapes(config: GPT2Config, part: str = "step") -> list[tuple[int, int]]:
    """(N, K) of a decoding step's products in order: 4 a layer, then the LM head; or only the
    layers' (`part` "layers"), or the LM head's shape three times ("head": a big product alone)."""
    width, inner = config.n_embd, config.mlp_width
    layers = [(3 * width, width), (width, width), (inner, width), (width, inner)] * config.n_layer
    head = [(config.vocab_size, width)]
    return {"step": layers + head, "layers": layers, "head": head * 3}[part]


def stored(weight: np.ndarray, weight_format: TensorFormat, bias: np.ndarray) -> list[np.ndarray]:
    """`weight` [N, K] as `gpt2_matmul` takes it in `weight_format`: the matrix or values, the block scales
    (empty for rows of floats), then the bias the kernel adds (empty: none)."""
    packed = weight_format.pack(weight_format.rows(weight))
    return [packed["weight"], packed.get("scales", np.zeros((0, 0), np.float16)), bias]


def step_graph(
    name: str,
    op: str,
    weight_format: TensorFormat,
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
        next_inputs = [k for _, k in shapes[1:]] + [shapes[-1][0]]
        for (n, _), next_k, product in zip(shapes, next_inputs, products, strict=True):
            taken, weights = weights[: len(product)], weights[len(product) :]
            product = [TensorType(DType.float32, [rows, n], CPU_REF)]
            (y,) = ops.custom(op, CPU_REF, [hidden, *taken], product, {"format": weight_format.kernel_format})
            # What the next product takes of y: c_attn's queries feed c_proj, a head's first columns the next.
            hidden = y[:, :next_k] if n > next_k else y
        graph.output(y)
    return graph


def load_op_by_op_lm(checkpoint: Path, weight_format: TensorFormat, cache_dir: Path) -> CompiledLM:
    """`load_lm` with every block op by op (`Block` with the kernel layers) instead of a `KernelBlock`,
    its caches in `cache_dir` (graphs kept under ours are keyed as ours and would run one op a block)."""
    with mock.patch.object(gpt2, "block_for", lambda config, kernels: Block):
        return load_lm(checkpoint, device="cpu", weight_format=weight_format, cache_dir=cache_dir)


def spread(first: list[float], second: list[float]) -> str:
    """The middle half of second / first over the pairs of calls, as "q1-q3"."""
    q1, _, q3 = statistics.quantiles([b / a for a, b in zip(first, second, strict=True)], n=4)
    return f"{q1:.3f}-{q3:.3f}"


def time_steps(
    models: dict[str, CompiledLM], batch: int, prompt: int, rounds: int, rng: np.random.Generator
) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Seconds of each decoding step of each model, step by step in turn; each one's first step's logits."""
    seconds: dict[str, list[float]] = {name: [] for name in models}
    first: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        ids = rng.integers(0, next(iter(models.values())).config.vocab_size, (batch, prompt))
        caches = {name: lm.new_cache(batch, prompt + STEPS) for name, lm in models.items()}
        for name, lm in models.items():
            lm.prefill(ids, caches[name])
        tokens = ids[:, -1]
        for step in range(STEPS):
            for name in in_turn(list(models), step):
                start = time.perf_counter()
                logits = models[name].decode_step(tokens, caches[name])
                seconds[name].append(time.perf_counter() - start)
                first.setdefault(name, logits)
    return seconds, first


def time_prompts(
    models: dict[str, CompiledLM], batch: int, prompt: int, rounds: int, rng: np.random.Generator
) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Seconds of each model's prefill of the same prompts, in turn; each one's last logits."""
    seconds: dict[str, list[float]] = {name: [] for name in models}
    last: dict[str, np.ndarray] = {}
    for round in range(rounds):
        ids = rng.integers(0, next(iter(models.values())).config.vocab_size, (batch, prompt))
        for name in in_turn(list(models), round):
            cache = models[name].new_cache(batch, prompt)
            start = time.perf_counter()
            last[name] = models[name].prefill(ids, cache)
            seconds[name].append(time.perf_counter() - start)
    return seconds, last


def compare_steps(cases: str, models: dict[str, CompiledLM], rounds: int, prompts: bool = False) -> None:
    """Prints whole decoding steps (or with `prompts` the prompts before them) of two models of the
    benchmark checkpoint, the second against the first."""
    first, second = models
    rng = np.random.default_rng(0)
    print(f"| batch x positions | {first} ms | {second} ms | ratio | pairs' middle half | max difference |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in cases.split(","):
        batch, prompt = (int(v) for v in case.split("x"))
        seconds, logits = (time_prompts if prompts else time_steps)(models, batch, prompt, rounds, rng)
        difference = float(np.abs(logits[first] - logits[second]).max())
        first_ms, second_ms = (statistics.median(seconds[name]) * 1e3 for name in models)
        shape = f"{prompt} prompt" if prompts else f"{prompt}..{prompt + STEPS}"
        print(
            f"| {batch} x {shape} | {first_ms:.2f} | {second_ms:.2f} | "
            f"{second_ms / first_ms:.3f} | {spread(seconds[first], seconds[second])} | {difference:.1e} |",
            flush=True,
        )


def compare_products(args: argparse.Namespace) -> None:
    """Prints a step's products (or `--part`'s) through our op and the copy's, at each of `--rows`."""
    config = MODELS[args.model]
    shapes = step_shapes(config, args.part)
    rng = np.random.default_rng(0)
    # Unit-variance outputs through the whole chain: weights ~ N(0, 1/K); the projections have
    # biases (zeros here), the head none.
    arrays = [
        stored(
            rng.standard_normal((n, k), np.float32) / np.float32(np.sqrt(k)),
            args.weight_format,
            np.zeros(0 if n == config.vocab_size else n, np.float32),
        )
        for n, k in shapes
    ]
    streamed = sum(a.nbytes for product in arrays for a in product)
    products = [[packed_buffer(a) for a in product] for product in arrays]
    weights = [buffer for product in products for buffer in product]
    session = InferenceSession(devices=[CPU()])
    print(machine_description(CPU()))
    print(
        "| rows | ours ms | variant ms | ours GB/s | variant GB/s | variant / ours | pairs' middle half |"
        " max difference |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as temporary:
        variant = renamed_copy(args.variant, Path(temporary))
        extensions = [kernel_library(), compiled_package(variant, cache=Path(temporary))]
        for rows in (int(r) for r in args.rows.split(",")):
            models: dict[str, Model] = {
                name: session.load(
                    step_graph(
                        f"ab_{name}_{args.weight_format}_{rows}",
                        "gpt2_matmul" + suffix,
                        args.weight_format,
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
            quiet_restless_threads()  # as a compiled model does after its first run
            seconds: dict[str, list[float]] = {name: [] for name in models}
            for call in range(args.rounds or PRODUCT_ROUNDS):
                for name in in_turn(list(models), call):
                    start = time.perf_counter()
                    models[name].execute(x, *weights)
                    seconds[name].append(time.perf_counter() - start)
            ours, theirs = (statistics.median(seconds[name]) for name in ("ours", "variant"))
            difference = float(np.abs(outputs["ours"] - outputs["variant"]).max())
            print(
                f"| {rows} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {streamed / ours / 1e9:.1f} | "
                f"{streamed / theirs / 1e9:.1f} | {theirs / ours:.3f} | "
                f"{spread(seconds['ours'], seconds['variant'])} | {difference:.1e} |",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", type=Path, nargs="?", help="an edited copy of max_gpt2/kernels")
    parser.add_argument("--weight-format", default="float32", choices=list(FORMATS))
    parser.add_argument(
        "--part",
        default="step",
        choices=PARTS,
        help="products: the whole step's, the layers' or the head's (default: step)",
    )
    parser.add_argument("--rows", default="1,8", help="rows of x (batch), comma-separated (default: 1,8)")
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument(
        "--rounds",
        type=int,
        help=f"timed calls of each product graph (default {PRODUCT_ROUNDS}), or with --steps prompts of"
        f" {STEPS} steps each (default {STEP_ROUNDS})",
    )
    parser.add_argument("--steps", help="whole decoding steps instead, BATCHxPOSITIONS,... (e.g. 1x32,8x100)")
    parser.add_argument(
        "--kv-cache", choices=["float16"], help="with --steps, no copy: against this KV cache"
    )
    parser.add_argument("--op-by-op", action="store_true", help="with --steps, no copy: against op by op")
    parser.add_argument(
        "--prompts", action="store_true", help="with --steps, the prompts of those shapes instead"
    )
    args = parser.parse_args()
    args.weight_format = FORMATS[args.weight_format]
    others = (args.variant is not None) + (args.kv_cache is not None) + args.op_by_op
    if others != 1 or (args.variant is None and not args.steps):
        parser.error("give an edited copy of the kernels, or --kv-cache or --op-by-op with --steps")
    if args.prompts and not args.steps:
        parser.error("--prompts times the prompts of --steps' shapes")
    if args.steps and args.part != "step":
        parser.error("--part picks products to time alone; --steps times whole steps")
    if args.steps:
        rounds = args.rounds or STEP_ROUNDS
        print(machine_description(CPU()))
        checkpoint = demo_checkpoint_for(args.model, default_cache_dir(), Progress(sys.stderr))
        # The format's default cache (float16 beside packed weights), or float32 against --kv-cache.
        ours = load_lm(
            checkpoint,
            device="cpu",
            weight_format=args.weight_format,
            kv_cache="float32" if args.kv_cache else None,
        )
        if args.kv_cache:
            other = load_lm(
                checkpoint, device="cpu", weight_format=args.weight_format, kv_cache=args.kv_cache
            )
            compare_steps(
                args.steps, {"float32 cache": ours, f"{args.kv_cache} cache": other}, rounds, args.prompts
            )
            return 0
        if args.op_by_op:
            with tempfile.TemporaryDirectory() as temporary:
                other = load_op_by_op_lm(checkpoint, args.weight_format, Path(temporary))
                compare_steps(args.steps, {"one op a block": ours, "op by op": other}, rounds, args.prompts)
            return 0
        with tempfile.TemporaryDirectory() as temporary:
            package = compiled_package(renamed_copy(args.variant, Path(temporary)), cache=Path(temporary))
            variant = load_variant_lm(checkpoint, args.weight_format, package)
            compare_steps(args.steps, {"ours": ours, "variant": variant}, rounds, args.prompts)
        return 0
    compare_products(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
