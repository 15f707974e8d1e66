"""`max-gpt2 serve`'s options, and the checks of those that need no checkpoint (the host, the origins).

Where vLLM's and llama-server's spellings differ, both are taken: `--allowed-origins` (vLLM's,
a JSON list) and `--cors-origins` (comma-separated) are one option, either form in either.
"""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

from max_gpt2.cli.console import (
    CHECKPOINT_HELP,
    add_listen_arguments,
    add_lora_arguments,
    add_weight_format_argument,
    positive_int,
)
from max_gpt2.inference.embeddings import Pooling


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    add_lora_arguments(parser)
    add_listen_arguments(parser, 8000)
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=["gpt2"],
        metavar="NAME",
        help="names clients may ask for as `model`, each listed by /v1/models (default: gpt2)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the demo checkpoint is kept")
    parser.add_argument(
        "--api-key",
        help="answer only requests bearing 'Authorization: Bearer KEY' or 'x-api-key: KEY' (/health "
        "stays open; default: the environment's MAX_GPT2_API_KEY)",
    )
    add_weight_format_argument(parser)  # the paged KV cache stays float32: no --kv-cache
    parser.add_argument(
        "--max-batch-size",
        type=positive_int,
        help="most requests in one step (default: GPT2MemoryPlanner's on a CPU, MAX's elsewhere)",
    )
    parser.add_argument(
        "--decode-steps",
        type=positive_int,
        help="greedy tokens a request may get per scheduler step on a CPU, sent together, as many "
        "as fit in about 50 ms (default: max_gpt2.serving.settings.DECODE_STEPS)",
    )
    parser.add_argument(
        "--prompt-lookup",
        type=positive_int,
        metavar="K",
        help="check up to K tokens looked up in each greedy request's prompt and text with its next one, "
        "on a CPU: the same output, faster where text repeats its input (default: none)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep prompts' keys and values in MAX's paged cache for later requests that begin alike, "
        "which then prefill only what follows (default: on; --no-enable-prefix-caching turns it off)",
    )
    parser.add_argument(
        "--embeddings",
        action="store_true",
        help="serve embeddings (POST /v1/embeddings), not text, as llama-server's --embeddings and vLLM's "
        "--runner pooling do: each text's final hidden states pooled (--pooling)",
    )
    parser.add_argument(
        "--pooling",
        choices=[pooling.value for pooling in Pooling],
        help="how --embeddings makes a text's vector: its last token's state (vLLM's default for a causal "
        "LM) or the mean over its tokens (default: last)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE_OR_NAME",
        help="render /v1/chat/completions' messages with this Jinja file or built-in template (chatml) "
        "(default: the checkpoint's own chat_template; none: chat requests are refused)",
    )
    parser.add_argument(
        "--allowed-origins",
        "--cors-origins",
        type=origins,
        action="extend",
        metavar="ORIGINS",
        help="let pages from these origins call the API from a browser (CORS): a JSON list or "
        "comma-separated, * for any (default: none, CORS off)",
    )
    parser.add_argument(
        "--telemetry",
        action="store_true",
        help="let MAX's serving stack send its usage telemetry to Modular (default: off, nothing "
        "leaves the machine)",
    )
    parser.add_argument(
        "--explorer",
        action="store_true",
        help="also serve the head explorer's page at /explore/ (max-gpt2 explore's; not with --api-key)",
    )


def pooling_of(args: argparse.Namespace) -> Pooling | None:
    """How a server of embeddings pools (`--pooling`, else the last token's), None for one that generates;
    refuses the options of the one kind given to the other."""
    if not args.embeddings:
        if args.pooling:
            raise ValueError(f"--pooling {args.pooling}: pools embeddings; give --embeddings too")
        return None
    for option, value in (("--prompt-lookup", args.prompt_lookup), ("--decode-steps", args.decode_steps)):
        if value is not None:
            raise ValueError(
                f"{option} {value}: sets how text is generated; a server of --embeddings generates none"
            )
    return Pooling(args.pooling) if args.pooling else Pooling.LAST


def origins(value: str) -> list[str]:
    """argparse type: origins as a JSON list (vLLM's `--allowed-origins '["*"]'`) or comma-separated."""
    if value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"not a JSON list of origins ({error.msg})") from None
        if not all(isinstance(origin, str) for origin in parsed):
            raise argparse.ArgumentTypeError(f"origins are strings; got {parsed!r}")
        return parsed
    return [origin.strip() for origin in value.split(",") if origin.strip()]


def check_host(host: str, port: int) -> None:
    """Refuses a `--host` that is not one address this machine resolves, before anything loads."""
    if "," in host or len(host.split()) != 1:
        raise ValueError(
            f"--host {host}: one address to listen on; for every interface give 0.0.0.0 (IPv4) or :: (IPv6)"
        )
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(
            f"--host {host}: {error.strerror}; give an address, or a name this machine resolves"
        ) from None
