"""`max-gpt2 convert`: a checkpoint to a GGUF file in one of our weight formats or one of llama-quantize's
presets, for us and for llama.cpp.

    max-gpt2 convert --checkpoint ~/models/gpt2 --weight-format q4_0 --out gpt2-q4_0.gguf
    max-gpt2 generate --checkpoint gpt2-q4_0.gguf --prompt "The cat"     # loads as q4_0
    llama-completion -m gpt2-q4_0.gguf -p "The cat" -n 20                # so does llama.cpp
    max-gpt2 convert --checkpoint ~/models/gpt2 --weight-format q4_k_m --out gpt2-q4_k_m.gguf

The checkpoint (a safetensors directory or a GGUF file) is read one tensor at a time,
converted (quantized by llama.cpp's rules, bit for bit) and streamed into the file, which
appears whole or not at all. In one of our formats the projections and the head are written in
its type (F32, BF16, Q8_0, Q4_0), the rest F32: what `llama-quantize --pure` would make from
llama.cpp's own F32 file. A preset (q4_k_m, q5_k_m, q6_k: `gguf_mixes`) mixes types as
`llama-quantize` does for it. Either way the file has llama.cpp's names, its `gpt2.*` metadata and,
where the checkpoint has one, its tokenizer as llama.cpp's converter writes GPT-2's.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from max_gpt2.cli.console import CHECKPOINT_HELP, adapters, add_lora_arguments, open_with_tokenizer
from max_gpt2.inference.tokenizer import gguf_vocabulary
from max_gpt2.model.checkpoints.gguf_checkpoint import gguf_metadata, gguf_tensors, pure_formats
from max_gpt2.model.checkpoints.gguf_writer import write_gguf
from max_gpt2.model.checkpoints.stored_weights import choose_format, requantizing
from max_gpt2.model.formats import FORMATS, format_named
from max_gpt2.model.formats.gguf_mixes import MIXES
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (it takes no `--device` or `--dtype`: `max_gpt2.cli.HOST_ONLY`)."""
    parser.add_argument("--checkpoint", required=True, help=CHECKPOINT_HELP.split(" (")[0])
    add_lora_arguments(parser)  # merged into the file written
    parser.add_argument(
        "--weight-format",
        choices=list(dict.fromkeys([*FORMATS, *MIXES])),  # q6_k is both: the preset's mix is what it writes
        help="the projections' and the head's type: one of ours, or llama-quantize's preset of that name "
        "(q4_k_m, q5_k_m, q6_k: types mixed as it mixes them; default: the checkpoint's own)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the GGUF file to write (NAME.gguf)")


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks the checkpoint, the format and the target, then writes the file tensor by tensor."""
    if args.out.suffix != ".gguf":
        raise ValueError(f"--out {args.out}: the file written is GGUF; name it NAME.gguf")
    if not args.out.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: no such directory {args.out.parent}")
    if args.out.is_dir():
        raise IsADirectoryError(f"--out {args.out}: a directory; name the file to write in it")
    try:  # before any work: a directory that takes no file fails here, not after the conversion
        with tempfile.TemporaryFile(dir=args.out.parent):
            pass
    except OSError as error:
        raise OSError(f"--out {args.out}: cannot write in {args.out.parent} ({error.strerror})") from None
    checkpoint, tokenizer = open_with_tokenizer(args.checkpoint, adapters(args))
    config, tied = checkpoint.config, checkpoint.tied
    mix = MIXES.get(args.weight_format)
    if mix is None:
        requested = None if args.weight_format is None else format_named(args.weight_format)
        chosen = choose_format(checkpoint, requested)
        formats, file_type = pure_formats(config, tied, chosen), chosen.file_type
    else:
        if refused := requantizing(checkpoint, mix):
            raise ValueError(refused)
        chosen, formats, file_type = mix, mix.formats(config, tied), mix.file_type
    specs, tensors = gguf_tensors(checkpoint, formats)
    quantized = any(kind.quantized for kind in formats.values())
    metadata = gguf_metadata(config, file_type, quantized, args.out.stem)
    if tokenizer is None:
        progress.note(f"{checkpoint.path} has no tokenizer: the file carries none (llama.cpp needs one)")
    else:
        metadata |= gguf_vocabulary(tokenizer, checkpoint.config.vocab_size)
    with progress.step(f"writing {len(specs)} tensors in {chosen} to {args.out}"):
        write_gguf(args.out, metadata, specs, tensors)
    progress.note(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB")
    return 0
