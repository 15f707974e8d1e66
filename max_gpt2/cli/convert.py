"""`max-gpt2 convert`: a checkpoint to a GGUF file in one of our weight formats, for us and for llama.cpp.

    max-gpt2 convert --checkpoint ~/models/gpt2 --weight-format q4_0 --out gpt2-q4_0.gguf
    max-gpt2 generate --checkpoint gpt2-q4_0.gguf --prompt "The cat"     # loads as q4_0
    llama-completion -m gpt2-q4_0.gguf -p "The cat" -n 20                # so does llama.cpp

The checkpoint (a safetensors directory or a GGUF file) is read one tensor at a time,
converted (quantized by llama.cpp's rules, bit for bit) and streamed into the file, which
appears whole or not at all. The projections and the head are written in the format's type
(F32, BF16, Q8_0, Q4_0), the rest F32, under llama.cpp's names with its `gpt2.*` metadata and,
where the checkpoint has one, its tokenizer as llama.cpp's converter writes GPT-2's: what
`llama-quantize --pure` would make from llama.cpp's own F32 file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from max_gpt2.cli.console import CHECKPOINT_HELP, add_weight_format_argument, open_with_tokenizer
from max_gpt2.inference.tokenizer import gguf_vocabulary
from max_gpt2.model.gguf_checkpoint import gguf_metadata, gguf_tensors
from max_gpt2.model.gguf_writer import write_gguf
from max_gpt2.model.stored_weights import choose_format
from max_gpt2.model.weight_formats import format_named
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype`, from the CLI's shared parent, do nothing here)."""
    parser.add_argument("--checkpoint", required=True, help=CHECKPOINT_HELP.split(" (")[0])
    add_weight_format_argument(parser)
    parser.add_argument("--out", type=Path, required=True, help="the GGUF file to write (NAME.gguf)")


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks the checkpoint, the format and the target, then writes the file tensor by tensor."""
    if args.out.suffix != ".gguf":
        raise ValueError(f"--out {args.out}: the file written is GGUF; name it NAME.gguf")
    if not args.out.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: no such directory {args.out.parent}")
    checkpoint, tokenizer = open_with_tokenizer(args.checkpoint)
    requested = None if args.weight_format is None else format_named(args.weight_format)
    weight_format = choose_format(checkpoint, requested)
    specs, tensors = gguf_tensors(checkpoint, weight_format)
    metadata = gguf_metadata(checkpoint.config, weight_format, args.out.stem)
    if tokenizer is None:
        progress.note(f"{checkpoint.path} has no tokenizer: the file carries none (llama.cpp needs one)")
    else:
        metadata |= gguf_vocabulary(tokenizer, checkpoint.config.vocab_size)
    with progress.step(f"writing {len(specs)} tensors in {weight_format} to {args.out}"):
        write_gguf(args.out, metadata, specs, tensors)
    progress.note(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB")
    return 0
