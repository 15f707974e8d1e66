"""`max-gpt2 bench-generate`: generation, ours beside Hugging Face and llama.cpp (`bench.generation`).

    max-gpt2 bench-generate --models small --cases 1x32+128,8x32+128 --rounds 5
    max-gpt2 bench-generate --models "" --checkpoint ~/models/gpt2 --no-curve
    max-gpt2 bench-generate --models small --weight-format float32,bfloat16,q8_0,q4_0 \
        --llama-bench llama.cpp/build/bin/llama-bench --gguf float32=small-f32.gguf,q8_0=small-q8_0.gguf

Results: `bench-results/bench-generate-<device>-<dtype>.json` and `.png`, and tables on stdout.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from max_gpt2.bench.generation import MODELS, run_benchmark
from max_gpt2.bench.generation_contenders import CONTENDERS
from max_gpt2.bench.generation_report import format_table, plot
from max_gpt2.bench.llama_cpp import check_binary, parse_gguf
from max_gpt2.bench.report import publish
from max_gpt2.cli.console import positive_int, seed_value
from max_gpt2.model.formats import FORMATS, format_named
from max_gpt2.outputs import Progress


def parse_cases(spec: str) -> list[tuple[int, int, int]]:
    """`"1x32+128,8x32+128"` -> [(1, 32, 128), (8, 32, 128)]: batch, prompt length, new tokens."""
    cases = []
    for item in spec.split(","):
        batch, _, rest = item.strip().partition("x")
        prompt, _, new = rest.partition("+")
        if not all(part.isdigit() and int(part) > 0 for part in (batch, prompt, new)):
            raise ValueError(
                f"--cases wants a list such as '1x32+128,8x32+128' (batch x prompt + new); got {item!r}"
            )
        cases.append((int(batch), int(prompt), int(new)))
    return cases


def cases_option(spec: str) -> list[tuple[int, int, int]]:
    """argparse type: `parse_cases`, its message shown as it is."""
    try:
        return parse_cases(spec)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--cases wants ")) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument(
        "--models", default="small,medium", help=f"from {', '.join(MODELS)}, or '' (default: all)"
    )
    parser.add_argument("--checkpoint", type=Path, help="also time this checkpoint directory")
    parser.add_argument(
        "--cases", type=cases_option, default="1x32+128,8x32+128", help="(default: 1x32+128,8x32+128)"
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="max and any of hf-eager, hf-sdpa")
    formats = ", ".join(FORMATS)
    parser.add_argument(
        "--weight-format", default="float32", help=f"ours in these, from {formats} (default: float32)"
    )
    parser.add_argument(
        "--kv-cache",
        default="",
        help="ours with the KV cache in these, from float32, float16 (default: float16 beside packed "
        "weights, else the compute dtype); runs off that default are named with -kv16 or -kv32",
    )
    parser.add_argument(
        "--llama-bench", type=Path, help="a llama.cpp build's llama-bench, to time beside ours"
    )
    parser.add_argument(
        "--gguf", default="", help="with --llama-bench: FORMAT=FILE,... GGUFs of the same weights"
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="llama-bench's threads (default: cores)",
    )
    parser.add_argument(
        "--prefill", type=int, default=1024, help="prefill length to time; 0: none (default: 1024)"
    )
    parser.add_argument(
        "--no-curve", dest="curve", action="store_false", help="skip tokens/s against context"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed rounds (default: 3)")
    parser.add_argument("--seed", type=seed_value, default=0)
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="where the generated checkpoints are kept"
    )
    parser.add_argument("--output", type=Path, default=Path("bench-results"), help="folder for JSON and PNG")


def check_arguments(args: argparse.Namespace) -> None:
    """Turns the comma lists into lists, refusing unknown names."""
    args.models = [name.strip() for name in args.models.split(",") if name.strip()]
    if unknown := [name for name in args.models if name not in MODELS]:
        raise ValueError(f"--models takes names from {', '.join(MODELS)}; got {', '.join(unknown)}")
    args.contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    if "max" not in args.contenders or any(name not in CONTENDERS for name in args.contenders):
        raise ValueError(
            f"--contenders takes max and any of hf-eager, hf-sdpa; got {','.join(args.contenders)}"
        )
    formats = (format_named(name.strip(), "--weight-format") for name in args.weight_format.split(","))
    args.weight_format = list(dict.fromkeys(formats))
    caches = [name.strip() for name in args.kv_cache.split(",") if name.strip()]
    if unknown := [name for name in caches if name not in ("float32", "float16")]:
        raise ValueError(f"--kv-cache takes float32 and float16; got {', '.join(unknown)}")
    args.kv_cache = list(dict.fromkeys(caches)) or [None]
    if bool(args.gguf) != (args.llama_bench is not None):
        raise ValueError("--llama-bench and --gguf go together: the binary, and the GGUF files it times")
    args.gguf = parse_gguf(args.gguf) if args.gguf else {}
    if args.llama_bench is not None:
        args.llama_bench = check_binary(args.llama_bench)
    if not args.models and args.checkpoint is None:
        raise ValueError("nothing to time: give --models or --checkpoint")
    if args.checkpoint is not None and Path(args.checkpoint).suffix == ".gguf":
        raise ValueError(
            f"--checkpoint {args.checkpoint}: a checkpoint directory (Hugging Face's layout), which every "
            "contender reads; to time a GGUF file as it loads, beside llama.cpp, run benchmarks/same_file.py"
        )
    if isinstance(args.cases, str):  # argparse leaves a default string unparsed
        args.cases = parse_cases(args.cases)


def main(args: argparse.Namespace, progress: Progress) -> int:
    check_arguments(args)
    report = run_benchmark(args, progress)
    stem = args.output / f"bench-generate-{report['device'].replace(':', '')}-{args.dtype}"
    publish(report, stem, format_table(report), plot)
    return 0
