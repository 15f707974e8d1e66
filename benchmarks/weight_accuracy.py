"""What each weight format costs in accuracy: logits, next-token distributions, greedy tokens, perplexity.

    python benchmarks/weight_accuracy.py       # trained-small (train_small.py) and GPT-2 small, random
    python benchmarks/weight_accuracy.py --checkpoint DIR [--text FILE] [--json OUT]
    python benchmarks/weight_accuracy.py --kv-cache float16   # each format also with a float16 KV cache
    python benchmarks/weight_accuracy.py --weight-format float32,bfloat16   # these formats only
    python benchmarks/weight_accuracy.py --weight-format float32,q4_k_m     # llama-quantize's preset

For each checkpoint, `--sequences` windows of `--length` tokens of text (the
checkpoint's `held-out.txt` where it has one, else the corpus we ship; seeded
random tokens for a checkpoint without a tokenizer) go through
the model in each format, as `generate` computes them (`lm.logits`: for packed
weights the Mojo kernels, activations rounded to bfloat16, or to int8 blocks of 32 for q8_0 and
q4_0 and of 256 for the K-quants), teacher-forced, and are compared with (a llama-quantize preset,
`gguf_mixes`, runs as a file written in it loads, `in_mix`):

    logit error   largest |logit - reference| over largest |reference logit|, the reference
                  being `max_gpt2.reference` in float64 on the checkpoint's float32 weights
    KL            mean over positions of KL(float32's next-token distribution || the format's), nats
    agreement     share of positions whose most likely next token is float32's
    perplexity    of the whole text (`lm.perplexity`, sliding window), and its change against float32

Random weights give nearly flat distributions, so their KL and agreement say
little; the trained model's are the ones to read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from max_gpt2 import CompiledLM, compile_lm, reference
from max_gpt2.bench.generation import demo_checkpoint_for
from max_gpt2.inference.beam_search import log_softmax
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32, FORMATS, WeightFormat, format_named, mixed
from max_gpt2.model.formats.gguf_mixes import MIXES, Mix
from max_gpt2.model.parameters import is_packed
from max_gpt2.outputs import Progress, default_cache_dir, write_atomically
from max_gpt2.testing import CORPUS


def in_mix(
    mix: Mix, weights: dict[str, np.ndarray], config: GPT2Config, tied: bool, cache: str
) -> CompiledLM:
    """`weights` as a file in `mix` loads (`GGUFCheckpoint`): the projections and the head each in its
    tensor's format where the kernels read them all (`formats.mixed`), else float32 holding the
    values of each tensor's blocks; the embedding the values of its blocks, float32."""
    kinds = mix.formats(config, tied)
    if tied:
        kinds["lm_head.weight"] = kinds["transformer.wte.weight"]  # token_embd: the head's blocks too
    native = mixed({name: kind for name, kind in kinds.items() if is_packed(name)})
    values = dict(weights)
    for name, kind in kinds.items():
        if native is None or not is_packed(name):  # what loads as float32: the values of its blocks
            values[name] = kind.values(kind.rows(weights[name]), weights[name].shape)
    return compile_lm(config, values, "cpu", weight_format=native or FLOAT32, kv_cache=cache)


def measure(
    checkpoint: Path,
    ids: np.ndarray,
    sequences: int,
    length: int,
    formats: list[WeightFormat | Mix],
    caches: list[str],
    progress: Progress,
) -> list[dict]:
    """One row per format of `formats` (float32 first) and KV cache dtype of `caches` (float32 first)
    for `checkpoint`, on `ids`."""
    opened = Checkpoint(checkpoint)
    config, weights = opened.config, opened.model_weights()
    length = min(length, config.n_positions, len(ids))
    starts = np.linspace(0, len(ids) - length, sequences).astype(int)
    windows = np.stack([ids[start : start + length] for start in starts])  # [S, length]
    with progress.step(f"{checkpoint.name}: the float64 reference"):
        expected = reference.lm_logits_and_largest_score(windows, weights, config)[0]
    rows, baseline = [], None
    for format, cache in ((format, cache) for format in formats for cache in caches):
        with progress.step(f"{checkpoint.name}: {format}, a {cache} KV cache"):
            # the weights read once; the cache float32 or float16
            if isinstance(format, Mix):
                lm = in_mix(format, weights, config, opened.tied, cache)
            else:
                lm = compile_lm(config, weights, "cpu", weight_format=format, kv_cache=cache)
            logits = lm.logits(windows)  # [S, length, vocab]
            result = lm.perplexity(ids)
        logprobs = log_softmax(logits)
        if baseline is None:
            baseline = logprobs
        kl = (np.exp(baseline) * (baseline - logprobs)).sum(axis=-1)
        rows.append(
            {
                "checkpoint": checkpoint.name,
                "weights": format.name,
                "kv_cache": cache,
                "logit_error": float(np.abs(logits - expected).max() / np.abs(expected).max()),
                "kl": float(kl.mean()),
                "agreement": float((logprobs.argmax(-1) == baseline.argmax(-1)).mean()),
                "perplexity": result.perplexity,
                "tokens": result.tokens,
            }
        )
    return rows


def tokens(checkpoint: Path, text: Path | None) -> np.ndarray:
    """The tokens to score: `text`, the checkpoint's held-out text or our corpus, else random ids."""
    tokenizer = load_tokenizer(checkpoint)
    if tokenizer is None:
        vocab_size = Checkpoint(checkpoint).config.vocab_size
        return np.random.default_rng(0).integers(0, vocab_size, 1024)
    held_out = checkpoint / "held-out.txt"
    source = text or (held_out if held_out.exists() else CORPUS)
    return np.asarray(tokenizer.encode(source.read_text(encoding="utf-8")).ids)


def table(rows: list[dict]) -> str:
    lines = [
        "| checkpoint | weights | KV cache | logit error | KL from float32 | greedy agreement | perplexity "
        "| vs float32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base = next(r for r in rows if r["checkpoint"] == row["checkpoint"])  # float32, float32 cache
        change = row["perplexity"] / base["perplexity"] - 1
        cells = [row["checkpoint"], row["weights"], row["kv_cache"], f"{row['logit_error']:.1e}"]
        cells += [f"{row['kl']:.1e}", f"{row['agreement']:.1%}", f"{row['perplexity']:.2f}", f"{change:+.2%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, action="append", help="repeatable (default: see above)")
    parser.add_argument("--text", type=Path, help="text to score (default: held-out.txt, else the corpus)")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--kv-cache", choices=["float16"], help="each format also with this KV cache")
    parser.add_argument(
        "--weight-format",
        default=",".join(FORMATS),
        help=f"comma-separated: our formats, llama-quantize's presets ({', '.join(MIXES)}); default: ours",
    )
    args = parser.parse_args()
    try:
        formats = [
            MIXES[name] if name in MIXES else format_named(name, "--weight-format")
            for name in args.weight_format.split(",")
        ]
    except ValueError as error:
        parser.error(str(error))
    if formats[0] is not FLOAT32:
        parser.error(
            f"--weight-format starts with float32, which the others are compared with; "
            f"got {args.weight_format}"
        )
    progress = Progress(sys.stderr)
    checkpoints = args.checkpoint
    if not checkpoints:
        trained = default_cache_dir() / "trained-small"
        small = demo_checkpoint_for("small", default_cache_dir(), progress)
        checkpoints = [trained, small] if (trained / "config.json").exists() else [small]
    rows = []
    for checkpoint in checkpoints:
        caches = ["float32", *([args.kv_cache] if args.kv_cache else [])]
        rows += measure(
            checkpoint, tokens(checkpoint, args.text), args.sequences, args.length, formats, caches, progress
        )
    print(table(rows))
    if args.json:
        write_atomically(args.json, lambda file: file.write_text(json.dumps(rows, indent=2) + "\n"))


if __name__ == "__main__":
    main()
