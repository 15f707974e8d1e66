"""The `max-gpt2` command: one module per subcommand, each with `add_arguments` and `main`.

`max-gpt2 --help` lists the subcommands; docs/architecture.md lists the modules. Progress goes
to stderr, results to stdout. The exit status is 0 on success, 1 when a check fails, 2 for bad
input (checked before anything compiles).
"""

from __future__ import annotations

import argparse
import ast
import gc
import importlib
import importlib.util
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from max_gpt2.outputs import Progress

COMMANDS = {
    "demo": "demo",
    "verify": "verify",
    "generate": "generate",
    "score": "score",
    "perplexity": "perplexity",
    "heads": "heads",
    "explore": "explore",
    "serve": "serve",
    "bench": "bench",
    "bench-generate": "bench_generate",
    "bench-startup": "bench_startup",
    "convert": "convert",
}
"""Each command's module in this package. Only the command run is imported (the benchmarks' modules,
say, take a second): the others' help lines are read from their sources."""
HOST_ONLY = frozenset({"convert", "bench-startup"})
"""Commands that compute on no device of their own: they take no `--device` or `--dtype`."""


def _help_line(module: str) -> str:
    """The first line of a command module's docstring, after its name: read, not imported."""
    spec = importlib.util.find_spec(f"{__name__}.{module}")
    assert spec is not None and spec.origin is not None
    docstring = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    return docstring.split("\n")[0].split(": ", 1)[-1]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command's options, or with `command` only that one's (the rest by name)."""
    from max_gpt2.inference.devices import DTYPES  # NumPy's and MAX's import: after `run` pauses collection

    parser = argparse.ArgumentParser(prog="max-gpt2", description="GPT-2 on MAX, checked against NumPy")
    commands = parser.add_subparsers(dest="command", required=True)
    target = argparse.ArgumentParser(add_help=False)  # every command's device and dtype
    target.add_argument("--device", default="auto", help="auto, cpu, gpu or gpu:N (default: auto)")
    target.add_argument("--dtype", default="float32", choices=list(DTYPES))
    for name, module in COMMANDS.items():
        parents = [] if name in HOST_ONLY else [target]
        subparser = commands.add_parser(name, parents=parents, help=_help_line(module))
        if command in (None, name):
            importlib.import_module(f"{__name__}.{module}").add_arguments(subparser)
    return parser


# What bad input raises, before any long work: reported in one line, with exit status 2.
BAD_INPUT = (OSError, ValueError, TypeError, ImportError)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, ModuleType]:
    """`argv`'s options and its command's module, imported (with it NumPy, MAX and our library)."""
    args = build_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    return args, importlib.import_module(f"{__name__}.{COMMANDS[args.command]}")


def main(argv: Sequence[str] | None = None) -> int:
    args, command = parse(sys.argv[1:] if argv is None else list(argv))
    return execute(args, command)


def execute(args: argparse.Namespace, command: ModuleType) -> int:
    """Runs `command` with `args`; the exit status, bad input and interruptions reported in one line."""
    try:
        return command.main(args, Progress(sys.stderr))
    except BrokenPipeError:  # the reader left (`| head`): end quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left unwritten goes
        return 1
    except KeyboardInterrupt:  # Ctrl-C: files being written are removed on the way (`write_atomically`)
        print(f"\nmax-gpt2 {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT  # as a shell reports a process ended by it
    except Terminated as ended:  # a SIGTERM (`run`): the same, quietly
        return ended.status
    except BAD_INPUT as error:
        print(f"max-gpt2 {args.command}: error: {error}", file=sys.stderr)
        return 2


def run() -> None:
    """The `max-gpt2` program: `main`, then, its output flushed, the process ends at once where it runs
    no thread or child process of ours: tearing down the interpreter and MAX's runtime would add
    0.05-0.1 s to every command and frees nothing (docs/performance.md, start-up). A SIGTERM (`kill`,
    `timeout`, a service manager) ends it as Ctrl-C does, no partial file left behind."""
    warnings.showwarning = OneLineWarnings()
    gc.disable()  # importing makes some 90,000 objects that live to the end: collecting took ~60 ms
    args, command = parse(sys.argv[1:])
    gc.freeze()  # ... and later collections need not walk them again (docs/performance.md, start-up)
    gc.enable()
    # Once MAX is imported (its runtime's set-up comes first), and unblocked should the parent have
    # left them blocked: signals a process inherits masked would stay pending for good.
    signal.signal(signal.SIGTERM, _terminated)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    status = execute(args, command)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: the interpreter's own exit reports it
        raise SystemExit(status) from None
    multiprocessing = sys.modules.get("multiprocessing")
    if threading.active_count() == 1 and not (multiprocessing and multiprocessing.active_children()):
        os._exit(status)
    raise SystemExit(status)


class Terminated(BaseException):
    """What SIGTERM's handler raises (`run`): it unwinds as Ctrl-C's `KeyboardInterrupt` does (what is
    being written is removed on the way), then `main` returns the status a shell reports for it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.status = 128 + signum


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


class OneLineWarnings:
    """`warnings.showwarning` for the program: a warning as one line (a cache that cannot be written, say),
    not Python's two with a line of our source, and each text once (options are checked before the work
    and again by it)."""

    def __init__(self) -> None:
        self.shown: set[str] = set()

    def __call__(self, message: Warning | str, category: type[Warning], *where: object) -> None:
        if str(message) not in self.shown:
            self.shown.add(str(message))
            print(f"max-gpt2: warning: {message}", file=sys.stderr)
