"""Helpers shared by the commands: argument types, the demo checkpoint, reading a prompt, storage options,
the port a server listens on.

The commands load the language model with `max_gpt2.load_lm`, as a user does, handing it their
`Progress` to report the reading and the compiling.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import sys
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from max_gpt2.inference.tokenizer import checkpoint_tokenizer, tokenizer_directory
from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint, open_checkpoint
from max_gpt2.model.checkpoints.lora import LoRA, MergedCheckpoint, with_adapters
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FORMATS
from max_gpt2.outputs import Progress, default_cache_dir
from max_gpt2.testing import write_checkpoint

CHECKPOINT_HELP = "GPT-2 checkpoint directory, Hub id or GGUF file (default: the demo one)"


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def seed_value(text: str) -> int:
    """argparse type: a seed, an integer of 0 or more (NumPy's generators take no negative one)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer of 0 or more, got {text}")
    return value


def token_list(text: str) -> list[int]:
    """argparse type: comma-separated token ids such as `464,3290` (each then checked against the
    vocabulary; here only that it is an id at all, 0 to 2**63 - 1)."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated ids such as 464,3290; got {text!r}"
        ) from None
    if past := [id_ for id_ in ids if not 0 <= id_ < 2**63]:
        raise argparse.ArgumentTypeError(
            f"{past[0]} is not a token id (ids count from 0 within the vocabulary)"
        )
    return ids


def parse_layers(spec: str, n_layer: int) -> list[int]:
    """`"all"`, or comma-separated indices and inclusive ranges such as `"0,3-5"`."""
    if spec == "all":
        return list(range(n_layer))
    layers: list[int] = []
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"--layers must be 'all' or a list such as '0,3-5'; got {spec!r}") from None
        if high < low:
            raise ValueError(f"--layers {spec!r}: the range {part.strip()} runs backwards")
        layers += range(low, high + 1)
    outside = [layer for layer in layers if not 0 <= layer < n_layer]
    if outside or not layers:
        raise ValueError(f"--layers {spec!r}: the checkpoint has {n_layer} layers (0 to {n_layer - 1})")
    return list(dict.fromkeys(layers))


CACHE_DIR_HELP = (
    "where the demo checkpoint, converted weights and compiled graphs are kept (default: "
    "$MAX_GPT2_CACHE, else ~/.cache/max-gpt2)"
)


def demo_checkpoint(cache_dir: Path, seed: int, progress: Progress) -> Path:
    """A GPT-2-small-shaped checkpoint with a small tokenizer in `cache_dir`, written once, reused after."""
    config = GPT2Config()
    path = cache_dir / f"gpt2-small-seed{seed}"
    config_file = path / "config.json"  # written last, so its presence means complete
    # One written by an older version may lack the tokenizer or the architecture name (for serving).
    complete = config_file.is_file() and (path / "tokenizer.json").is_file()
    if complete and "architectures" in json.loads(config_file.read_text()):
        progress.note(f"reusing the demo checkpoint in {path}")
        return path
    with progress.step(f"writing a GPT-2-small-shaped checkpoint (seed {seed}) with a tokenizer to {path}"):
        write_checkpoint(path, config, seed=seed, tokenizer=True)
    return path


def checkpoint_path(args: argparse.Namespace, progress: Progress) -> str | Path:
    """`--checkpoint`, else the demo checkpoint (seed 0) in `--cache-dir` or the default cache directory."""
    return args.checkpoint or demo_checkpoint(args.cache_dir or default_cache_dir(), 0, progress)


def add_listen_arguments(parser: argparse.ArgumentParser, port: int) -> None:
    """`--port` (default `port`; `check_port_free` checks it) and `--host` of a command that serves."""
    parser.add_argument("--port", type=positive_int, default=port, help=f"(default: {port})")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """`--lora` and `--lora-scaled`, as llama-server takes them: adapters merged as the weights load."""
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="PATH[,PATH...]",
        help="LoRA adapters merged into the projections: PEFT directories or GGUF adapter files",
    )
    parser.add_argument(
        "--lora-scaled",
        action="append",
        default=[],
        metavar="PATH:SCALE[,...]",
        help="adapters merged at SCALE times their own update",
    )


def adapters(args: argparse.Namespace) -> list[LoRA]:
    """The adapters `add_lora_arguments` parsed: `--lora`'s at scale 1, then `--lora-scaled`'s."""
    found = [LoRA(Path(path)) for given in args.lora for path in given.split(",") if path]
    for given in args.lora_scaled:
        for item in given.split(","):
            path, _, scale = item.rpartition(":")
            try:
                found.append(LoRA(Path(path), float(scale)))
            except ValueError:
                raise ValueError(f"--lora-scaled {item}: PATH:SCALE, the scale a finite number") from None
    return found


def add_prompt_arguments(parser: argparse.ArgumentParser, purpose: str) -> None:
    """`--checkpoint` with its adapters, `--prompt`, `--tokens` or `--prompt-file`, and `--cache-dir`:
    what `open_prompt` reads."""
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    add_lora_arguments(parser)
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help=f"text {purpose} (needs the checkpoint's tokenizer)")
    given.add_argument("--tokens", type=token_list, help=f"token ids {purpose}, e.g. 464,3290")
    given.add_argument(
        "--prompt-file", type=Path, help=f"a UTF-8 file of text {purpose}; - reads standard input"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


def open_with_tokenizer(
    path: str | Path, lora: list[LoRA] | None = None
) -> tuple[OpenedCheckpoint | MergedCheckpoint, Tokenizer | None]:
    """The checkpoint at `path` (`open_checkpoint`: its files and config checked, no tensor read) with
    `lora` merged as it loads, and its tokenizer if it has one (files beside it, else a GGUF file's own)."""
    checkpoint = with_adapters(open_checkpoint(path), lora or [])
    return checkpoint, checkpoint_tokenizer(checkpoint)


def open_prompt(
    args: argparse.Namespace, progress: Progress
) -> tuple[OpenedCheckpoint, Tokenizer | None, list[int]]:
    """The checkpoint (the demo one without `--checkpoint`), its tokenizer if it has one, the prompt's ids.

    Reads the config and the tokenizer, no tensor yet; a `--prompt` without a
    tokenizer is a `ValueError` naming the directory.
    """
    checkpoint, tokenizer = open_with_tokenizer(checkpoint_path(args, progress), adapters(args))
    if args.tokens is not None:
        return checkpoint, tokenizer, args.tokens
    text = args.prompt if args.prompt is not None else read_prompt_file(args.prompt_file)
    if tokenizer is None:
        raise ValueError(
            f"{checkpoint.path} has no tokenizer (tokenizer.json, or vocab.json and merges.txt, in "
            f"{tokenizer_directory(checkpoint.path).resolve()}, or a GGUF file's own); give the prompt as "
            "--tokens instead"
        )
    if not (ids := tokenizer.encode(text).ids):
        given = "--prompt" if args.prompt is not None else f"--prompt-file {args.prompt_file}"
        raise ValueError(f"{given}: the prompt is empty; GPT-2 needs at least one token to continue")
    return checkpoint, tokenizer, ids


def read_prompt_file(path: Path) -> str:
    """The text of `--prompt-file` (`-`: standard input), as UTF-8; a ValueError names an unreadable file."""
    try:
        if str(path) == "-":  # as bytes: the locale's decoding would let invalid bytes through as surrogates
            return sys.stdin.buffer.read().decode("utf-8")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--prompt-file {path}: {error}") from None


def add_weight_format_argument(parser: argparse.ArgumentParser) -> None:
    """`--weight-format`: how the projections and the LM head are stored (`max_gpt2.model.formats`)."""
    parser.add_argument(
        "--weight-format",
        choices=list(FORMATS),
        help="store the projections and the LM head as this (CPU, float32 compute; default: the "
        "checkpoint's own, float32 or a GGUF file's type)",
    )


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """`--weight-format` and `--kv-cache`: how the projections and the LM head, and the KV cache, are
    stored."""
    add_weight_format_argument(parser)
    parser.add_argument(
        "--kv-cache",
        choices=["float32", "float16"],
        help="the KV cache's dtype; float16 is half the bytes (float32 compute; default: float16 with "
        "a packed --weight-format, else the compute dtype)",
    )


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """What `add_storage_arguments` parsed, and `--cache-dir`, as `load_lm`'s keywords."""
    return {"weight_format": args.weight_format, "kv_cache": args.kv_cache, "cache_dir": args.cache_dir}


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine alone."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port_free(port: int) -> None:
    """Refuses a port something already listens on, as MAX's server would after seconds of loading
    (the same test: bound on every interface, SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            raise ValueError(f"--port {port}: the port is in use ({error.strerror}); pick another") from None
