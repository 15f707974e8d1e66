"""`max-gpt2 explore`: every attention head and each token's probability, on a local web page.

    max-gpt2 explore --checkpoint ~/models/gpt2            # then open http://127.0.0.1:8010/

Loads the checkpoint (any `load_lm` reads, in any weight format) with its attention-weights
graph and the graphs that continue a text, then serves the head explorer (`max_gpt2.explorer`)
on `--host`:`--port` until Ctrl-C. On the page: type or paste text (token ids, for a checkpoint
without a tokenizer), continue it if you like, and look at the model view, the head view, the
heads' previous-token, duplicate-token and induction scores and each token's probability
(docs/heads.md). `max-gpt2 serve --explorer` serves the same page beside the API, and
`max-gpt2 heads --html` writes it for one text as a single file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from max_gpt2.cli.console import (
    CHECKPOINT_HELP,
    add_listen_arguments,
    add_weight_format_argument,
    check_port_free,
    checkpoint_path,
    is_loopback,
)
from max_gpt2.explorer.app import ExplorerApp
from max_gpt2.explorer.server import explorer_server
from max_gpt2.outputs import Progress

PORT = 8010


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    add_listen_arguments(parser, PORT)
    parser.add_argument("--cache-dir", type=Path, help="where the demo checkpoint is kept")
    add_weight_format_argument(parser)


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks the port, loads and compiles, then serves until interrupted."""
    check_port_free(args.port)  # before minutes of compiling
    if not is_loopback(args.host):
        progress.note(
            f"warning: --host {args.host} shows the page, and runs the model, for anyone who reaches it"
        )
    path = checkpoint_path(args, progress)
    app = ExplorerApp.load(str(path), args.device, args.dtype, args.weight_format, progress)
    server = explorer_server(app, args.host, args.port)
    print(
        f"the head explorer is at http://{args.host}:{server.server_address[1]}/ (Ctrl-C stops it)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        progress.note("stopped")
    finally:
        server.server_close()
    return 0
