"""`max-gpt2 serve`: our GPT-2 behind MAX's own OpenAI-compatible server (`max serve`).

    max-gpt2 serve --checkpoint ~/models/gpt2 --port 8000 [--api-key KEY]
    curl localhost:8000/v1/completions -d '{"model": "gpt2", "prompt": "Hello", "max_tokens": 20}'

It checks the checkpoint (files, `config.json`, tokenizer; or a GGUF file, served from a
model directory made beside it in the cache: `max_gpt2.cli.serve_gguf`) and the serving
extra, then becomes MAX's `max serve` with our architecture (`max_gpt2.serving`) on the
local checkpoint, offline, through `max_gpt2.serving.server`, which puts our guard
in front of MAX's routes (an API key, the routes GPT-2 answers, every completion
field honoured or refused by name: docs/serving.md); it prints that command.
Keys and values live in MAX's paged KV cache. Up to `--max-batch-size` requests
share each step (`max_gpt2.serving.memory_planner.CPU_BATCH_SIZE` on a CPU), and
a new prompt joins the step of those decoding (in-flight batching). MAX serves
float32 on CPU; bfloat16 is for GPUs. On a CPU `--weight-format` stores the
projections and the LM head as bfloat16, q8_0 or q4_0
(`max_gpt2.model.weight_formats`; by default the checkpoint's own, as `load_lm` picks it),
converted once into the weights cache and memory-mapped when the server loads. On a CPU a step of
greedy requests that are all decoding runs up to `--decode-steps` tokens, within
about 50 ms, before MAX's scheduler sees it again (`max_gpt2.serving.pipeline`):
streamed tokens then come a few at a time; with `--prompt-lookup K` each of those runs also
checks up to K tokens looked up in each request's prompt and text, keeping those the model
chooses (`max_gpt2.serving.drafts`). What MAX's command line cannot carry
(the format, the steps, the drafts, the API key) goes in environment variables (`our_variables`).
The server answers OpenAI's `logprobs` (up to 7 alternatives) and, started with
`--enable-echo` as here, `echo` (the prompt's log-probabilities, what
lm-evaluation-harness scores with); prefix caching is off, since echo needs every
prompt token computed. If MAX's model worker dies the server exits non-zero and
says why. MAX's server leaves its ZMQ sockets in the temporary directory when it
stops, however it stops; it gets a directory of its own (`TMPDIR`), removed once
the server is gone. With `--explorer` the head explorer (`max-gpt2 explore`'s page) is
served at /explore/ beside the API, its own model loading in the server's process once the
page is first asked for (`max_gpt2.explorer.loading`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from max_gpt2.cli.console import (
    CHECKPOINT_HELP,
    add_listen_arguments,
    add_weight_format_argument,
    check_port_free,
    checkpoint_path,
    is_loopback,
    positive_int,
)
from max_gpt2.cli.serve_gguf import WEIGHTS, model_directory
from max_gpt2.explorer.loading import ExplorerSettings
from max_gpt2.inference.devices import device_name, resolve_device
from max_gpt2.inference.loading import plan_load
from max_gpt2.model.weight_formats import FORMATS
from max_gpt2.outputs import Progress, default_cache_dir

# What MAX's `max[serve]` extra adds that the core package does not have.
SERVE_MODULES = ("fastapi", "uvicorn", "transformers", "zmq")
ARCHITECTURE = "GPT2LMHeadModel"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where max_gpt2 lies: MAX's worker imports it from there
SOCKET_DIRECTORY_MAX = 64  # the longest directory MAX makes its ZMQ sockets in (else /tmp)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    add_listen_arguments(parser, 8000)
    parser.add_argument("--served-model-name", default="gpt2", help="name clients ask for (default: gpt2)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the demo checkpoint is kept")
    parser.add_argument(
        "--api-key",
        help="answer only requests bearing 'Authorization: Bearer KEY' (/health stays open; "
        "default: the environment's MAX_GPT2_API_KEY)",
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
        "as fit in about 50 ms (default: max_gpt2.serving.pipeline.DECODE_STEPS)",
    )
    parser.add_argument(
        "--prompt-lookup",
        type=positive_int,
        metavar="K",
        help="check up to K tokens looked up in each greedy request's prompt and text with its next one, "
        "on a CPU: the same output, faster where text repeats its input (default: none)",
    )
    parser.add_argument(
        "--explorer",
        action="store_true",
        help="also serve the head explorer's page at /explore/ (max-gpt2 explore's; not with --api-key)",
    )


def main(args: argparse.Namespace, progress: Progress) -> int:
    check_port_free(args.port)
    command, env = serve_command(args, progress)
    key_variable = our_variables().api_key
    progress.note("starting MAX's server; the same, by hand:")
    settings = [
        f"{name}={'<key>' if name == key_variable else value}"
        for name, value in env.items()
        if name in ("PYTHONPATH", *our_variables())
    ]
    progress.note("  " + shlex.join([*settings, "python", *command[1:]]))
    sys.stderr.flush()
    sockets = socket_directory()
    remove_when_gone(sockets)
    os.execve(sys.executable, command, {**env, "TMPDIR": sockets})  # the server takes over this process


def socket_directory() -> str:
    """A new directory for MAX's sockets, in the temporary directory where their paths fit, else in /tmp.

    A ZMQ socket's path has at most 107 bytes and MAX's add 43 to the directory's: MAX puts them
    in /tmp instead of a longer directory, where they would not be removed with ours."""
    directory = tempfile.mkdtemp(prefix="max-gpt2-serve-")
    if len(directory) <= SOCKET_DIRECTORY_MAX:
        return directory
    os.rmdir(directory)
    return tempfile.mkdtemp(prefix="max-gpt2-serve-", dir="/tmp")


def remove_when_gone(directory: str) -> None:
    """Starts a shell, in a session of its own (out of reach of the signals that stop the server's
    process group), that removes `directory` once this process, and the server it becomes, has
    ended, whatever ended it: the shell reads a pipe whose writing end only this process holds,
    across the exec, and the read ends when the last holder is gone. Nothing polls meanwhile."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    subprocess.Popen(
        ["sh", "-c", 'cat > /dev/null; rm -rf "$0"', directory],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(read_end)


def missing_modules(names: tuple[str, ...] = SERVE_MODULES) -> list[str]:
    """Those of `names` that cannot be imported here (by default, what the serving extra adds)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def require_serve_extra() -> None:
    """Refuses early, naming what is missing, where MAX's serving dependencies are not installed."""
    if missing := missing_modules():
        raise ImportError(
            f"serving needs MAX's serving extra ({', '.join(missing)} not installed): "
            f"pip install 'max-gpt2[serve]' (from a checkout: pip install -e '.[serve]')"
        )


def serve_command(args: argparse.Namespace, progress: Progress) -> tuple[list[str], dict[str, str]]:
    """The `max serve` command line and its environment, after every check that can fail early: the
    serving extra, the dtype and the environment first, then the load's plan (`plan_load`, as every
    load), then what a server needs of the checkpoint (a tokenizer; MAX's architecture name)."""
    require_serve_extra()
    if args.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype {args.dtype}: the server runs float32 or bfloat16")
    variables = our_variables()
    env = server_environment(args, progress)
    if args.explorer and env.get(variables.api_key):
        raise ValueError(
            "--explorer: the explorer's page cannot send an API key, so it is not served beside one "
            "(--api-key or MAX_GPT2_API_KEY); run max-gpt2 explore on its own port instead"
        )
    path = checkpoint_path(args, progress)
    devices = device_name(resolve_device(args.device))
    # With the explorer, also what its attention-weights graph needs of the device.
    plan = plan_load(
        path, args.device, args.dtype, weight_format=args.weight_format, output_attentions=args.explorer
    )
    checkpoint, device, weight_format = plan.checkpoint, plan.options.device, plan.options.weight_format
    if device.is_host and args.dtype != "float32":
        raise ValueError(f"--dtype {args.dtype}: MAX serves float32 on CPU; bfloat16 needs a GPU")
    if args.prompt_lookup and not (device.is_host and args.dtype == "float32"):
        raise ValueError(
            f"--prompt-lookup {args.prompt_lookup}: drafts are checked by the decoding kernels, which run on "
            f"the CPU in float32, not on {device_name(device)} in {args.dtype}"
        )
    if weight_format.kernels_only:
        env[variables.weight_format] = weight_format.name
    if args.explorer:  # a file's own mix is what the explorer loads it as by default (None)
        own = weight_format.name if weight_format.name in FORMATS else None
        settings = ExplorerSettings(str(path), args.device, args.dtype, own)
        env[variables.explorer] = settings.to_json()
    tokenizer = plan.tokenizer()
    if tokenizer is None:
        raise ValueError(
            f"{checkpoint.path} has no tokenizer (tokenizer.json, or vocab.json and merges.txt, or a GGUF "
            f"file's own); a server takes and returns text"
        )
    if (vocab := checkpoint.config.vocab_size) > (known := tokenizer.get_vocab_size(with_added_tokens=True)):
        raise ValueError(
            f"{checkpoint.path}: the model's vocab_size={vocab} is more than its tokenizer's {known} tokens; "
            f"MAX's server stops when a request generates an id it cannot decode ({known} to {vocab - 1})"
        )
    config_file = checkpoint.path / "config.json"
    if checkpoint.one_file:  # a GGUF file: MAX reads a directory made for it
        model = model_directory(checkpoint, tokenizer, ARCHITECTURE, default_cache_dir())
    elif not checkpoint.path.is_dir():
        raise ValueError(f"--checkpoint {path}: serving needs the checkpoint's directory, not a file in it")
    elif ARCHITECTURE not in (named := json.loads(config_file.read_text()).get("architectures") or []):
        raise ValueError(
            f"{config_file} names the architectures {named}, and MAX picks the model by that list: add "
            f'"architectures": ["{ARCHITECTURE}"] (save_pretrained writes it)'
        )
    else:
        model = checkpoint.path.resolve()
    command = [
        sys.executable,
        "-m",
        "max_gpt2.serving.server",  # MAX's `max` command, with our guard on its HTTP app
        "serve",
        "--custom-architectures=max_gpt2.serving",
        f"--model-path={model}",
        *([f"--weight-path={model / WEIGHTS}"] if checkpoint.one_file else []),
        f"--served-model-name={args.served_model_name}",
        f"--devices={devices}",
        f"--quantization-encoding={args.dtype}",
        f"--host={args.host}",
        f"--port={args.port}",
        "--enable-echo",  # every token's logits: the prompt's log-probabilities for `echo`
        "--no-enable-prefix-caching",  # a cached prefix would have no log-probabilities to echo
        "--enable-in-flight-batching",  # a new prompt joins the running decodes' step, not stalls them
        *([f"--max-batch-size={args.max_batch_size}"] if args.max_batch_size is not None else []),
    ]
    return command, env


def server_environment(args: argparse.Namespace, progress: Progress) -> dict[str, str]:
    """MAX's processes' environment: this one's, our options in our variables (`our_variables`: the
    weight format is added once the load is planned), the package on the path, offline."""
    # MAX's model worker is a fresh interpreter that must import max_gpt2; an editable
    # install is not always visible to it (seen here), an explicit path always is.
    paths = [str(PACKAGE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1"}
    variables = our_variables()
    api_key = args.api_key or os.environ.get(variables.api_key)
    for name in variables:  # our options decide, not the env
        env.pop(name, None)
    if args.decode_steps is not None:
        env[variables.decode_steps] = str(args.decode_steps)
    if args.prompt_lookup:
        env[variables.prompt_lookup] = str(args.prompt_lookup)
    if api_key:
        env[variables.api_key] = api_key  # not on the command line, where every user of the machine reads it
    elif not is_loopback(args.host):
        progress.note(
            f"warning: --host {args.host} lets other machines reach the model, and no --api-key is set: "
            f"anyone who can reach port {args.port} can use it"
        )
    return env


class OurVariables(NamedTuple):
    """The environment variables that carry our options to MAX's processes, by option."""

    weight_format: str
    decode_steps: str
    prompt_lookup: str
    api_key: str
    explorer: str


def our_variables() -> OurVariables:
    """How `--weight-format`, `--decode-steps`, `--prompt-lookup`, `--api-key` and `--explorer` reach MAX's
    processes: its command line has no option an architecture may add."""
    from max_gpt2.serving import server  # the serving extra, checked by now

    return OurVariables(
        server.WEIGHT_FORMAT_VARIABLE,
        server.DECODE_STEPS_VARIABLE,
        server.PROMPT_LOOKUP_VARIABLE,
        server.API_KEY_VARIABLE,
        server.EXPLORER_VARIABLE,
    )
