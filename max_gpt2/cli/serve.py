"""`max-gpt2 serve`: our GPT-2 behind MAX's own OpenAI-compatible server (`max serve`).

    max-gpt2 serve --checkpoint ~/models/gpt2 --port 8000 [--api-key KEY] [--chat-template chatml]
    curl localhost:8000/v1/completions -d '{"model": "gpt2", "prompt": "Hello", "max_tokens": 20}'

It checks the checkpoint (files, `config.json`, tokenizer; or a GGUF file, served from a
model directory made beside it in the cache: `max_gpt2.cli.serve_gguf`), the serving
extra and the options (`serve_options`), then becomes MAX's `max serve` with our
architecture (`max_gpt2.serving`) on the local checkpoint, offline, through
`max_gpt2.cli.serve_process`, which mounts our front end on MAX's HTTP app
(`max_gpt2.serving.api`: completions, chat, tokenize, metrics, every field honoured or
refused by name: docs/serving.md); it prints that command. What MAX's command line cannot
carry goes to MAX's processes as one `ServingSettings` in the environment, the API key in
a variable of its own. MAX's telemetry to Modular is off unless `--telemetry`. Keys and
values live in MAX's paged KV cache; up to `--max-batch-size` requests share each step
(`max_gpt2.serving.memory_planner.CPU_BATCH_SIZE` on a CPU), a new prompt joining the
step of those decoding (in-flight batching). MAX serves float32 on CPU; bfloat16 is for
GPUs; on a CPU `--weight-format` stores the projections and the LM head in a packed
format (`max_gpt2.model.formats`), converted once into the weights cache. Started
with `--enable-echo`, the server answers `echo` (the prompt's log-probabilities, what
lm-evaluation-harness scores with). MAX's prefix cache keeps each prompt's full pages of keys
and values for later prompts that begin alike (off with `--no-enable-prefix-caching`); a
request for its prompt's log-probabilities reads none of them. If MAX's model worker dies the
server exits non-zero and says why. MAX's server leaves its ZMQ sockets in the temporary
directory when it stops; it gets a directory of its own (`TMPDIR`, where the metrics socket
lies too), removed once the server is gone. With `--explorer` the head explorer is served at
/explore/ beside the API. With `--embeddings` it runs MAX's embeddings pipeline instead and answers
`/v1/embeddings` in place of the generating routes (docs/embeddings.md).
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

from tokenizers import Tokenizer

from max_gpt2.cli.console import adapters, check_port_free, checkpoint_path, is_loopback
from max_gpt2.cli.serve_gguf import WEIGHTS, model_directory
from max_gpt2.cli.serve_options import add_arguments, check_host, pooling_of
from max_gpt2.explorer.loading import ExplorerSettings
from max_gpt2.inference.devices import device_name, resolve_device
from max_gpt2.inference.loading import plan_load
from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint, open_checkpoint
from max_gpt2.model.checkpoints.lora import with_adapters
from max_gpt2.model.formats import FLOAT32, FORMATS
from max_gpt2.outputs import Progress, default_cache_dir
from max_gpt2.serving.chat_templates import chat_template_file
from max_gpt2.serving.settings import (
    API_KEY_VARIABLE,
    DECODE_STEPS,
    EMBEDDINGS_BATCH,
    VARIABLE,
    ServingSettings,
    check_device,
    check_request,
    check_tokenizer,
)

# What MAX's `max[serve]` extra adds that the core package does not have.
SERVE_MODULES = ("fastapi", "uvicorn", "transformers", "zmq")
ARCHITECTURE = "GPT2LMHeadModel"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where max_gpt2 lies: MAX's worker imports it from there
SOCKET_DIRECTORY_MAX = 64  # the longest directory MAX makes its ZMQ sockets in (else /tmp)
# MAX's switches for what it would send to Modular: its serving stack's, and its runtime's.
TELEMETRY_OFF = {"MAX_SERVE_DISABLE_TELEMETRY": "1", "MODULAR_TELEMETRY_ENABLED": "0"}


__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace, progress: Progress) -> int:
    check_port_free(args.port)
    sockets = socket_directory()
    remove_when_gone(sockets)
    command, env = serve_command(args, progress, sockets)
    progress.note("starting MAX's server; the same, by hand:")
    shown = [
        f"{name}={shlex.quote('<key>' if name == API_KEY_VARIABLE else value)}"
        for name, value in env.items()
        if name in ("PYTHONPATH", VARIABLE, API_KEY_VARIABLE, *TELEMETRY_OFF)
    ]
    progress.note("  " + " ".join([*shown, shlex.join(["python", *command[1:]])]))
    sys.stderr.flush()
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


def serve_command(
    args: argparse.Namespace, progress: Progress, runtime_directory: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The `max serve` command line and its environment, after every check that can fail early: the
    serving extra, the dtype, the host and the key first, then the load's plan (`plan_load`, as every
    load), then what a server needs of the checkpoint (a tokenizer; MAX's architecture name) and the
    chat template. `runtime_directory`: the server's own directory, where its metrics socket lies."""
    require_serve_extra()
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE)
    check_request(args.dtype, args.explorer, bool(api_key))
    check_host(args.host, args.port)
    chat_template = chat_template_file(args.chat_template) if args.chat_template else None
    path = checkpoint_path(args, progress)
    devices = device_name(resolve_device(args.device))
    # With the explorer, also what its attention-weights graph needs of the device.
    lora = adapters(args)
    if lora and args.explorer:
        raise ValueError("--explorer: the head explorer loads the checkpoint alone; leave out --lora")
    base = open_checkpoint(path)
    plan = plan_load(
        with_adapters(base, lora),
        args.device,
        args.dtype,
        weight_format=args.weight_format,
        output_attentions=args.explorer,
    )
    checkpoint, device, weight_format = plan.checkpoint, plan.options.device, plan.options.weight_format
    # With the explorer, a file's own mix is what it loads as by default (None).
    explorer = ExplorerSettings(
        str(path), args.device, args.dtype, weight_format.name if weight_format.name in FORMATS else None
    )
    settings = ServingSettings(
        served_names=tuple(args.served_model_name),
        weight_format=weight_format.name if weight_format.kernels_only else FLOAT32.name,
        decode_steps=args.decode_steps or DECODE_STEPS,
        prompt_lookup=args.prompt_lookup or 0,
        allowed_origins=tuple(args.allowed_origins or ()),
        explorer=explorer.to_json() if args.explorer else None,
        metrics_socket=f"{runtime_directory}/metrics.sock" if runtime_directory else None,
        pooling=pooling_of(args),
        lora=tuple((str(adapter.path.resolve()), adapter.scale) for adapter in lora),
    )
    check_device(settings, args.dtype, device.is_host, device_name(device))
    model = served_model(base, plan.tokenizer(), path)
    command = [
        sys.executable,
        "-m",
        "max_gpt2.cli.serve_process",  # MAX's `max` command, with our front end on its HTTP app
        "serve",
        "--custom-architectures=max_gpt2.serving",
        f"--model-path={model}",
        *([f"--weight-path={model / WEIGHTS}"] if checkpoint.one_file else []),
        f"--served-model-name={settings.served_names[0]}",
        f"--devices={devices}",
        f"--quantization-encoding={args.dtype}",
        f"--host={args.host}",
        f"--port={args.port}",
        *([f"--chat-template={chat_template}"] if chat_template else []),
        *(embeddings_options(args) if settings.embeds else generation_options(args)),
    ]
    return command, server_environment(args, progress, settings, api_key)


def generation_options(args: argparse.Namespace) -> list[str]:
    """MAX's options for a server that generates (the task named: our architecture has two)."""
    return [
        "--task=text_generation",
        "--enable-echo",  # every token's logits: the prompt's log-probabilities for `echo`
        # A prompt's full pages kept for later prompts that begin alike (MAX's prefix cache); a request
        # for the prompt's log-probabilities reads none of them (`max_gpt2.serving.tokenizer`).
        "--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching",
        "--enable-in-flight-batching",  # a new prompt joins the running decodes' step, not stalls them
        *([f"--max-batch-size={args.max_batch_size}"] if args.max_batch_size is not None else []),
    ]


def embeddings_options(args: argparse.Namespace) -> list[str]:
    """MAX's options for a server of embeddings: its embeddings pipeline, texts embedded `EMBEDDINGS_BATCH`
    (or `--max-batch-size`) at a time."""
    return ["--task=embeddings_generation", f"--max-batch-size={args.max_batch_size or EMBEDDINGS_BATCH}"]


def served_model(checkpoint: OpenedCheckpoint, tokenizer: Tokenizer | None, path: str | Path) -> Path:
    """The model directory MAX serves: the checkpoint's own, or one made for a GGUF file; refused where
    MAX could not serve it (no tokenizer, one smaller than the model's vocabulary, no architecture)."""
    tokens = None if tokenizer is None else tokenizer.get_vocab_size(with_added_tokens=True)
    check_tokenizer(checkpoint.path, checkpoint.config.vocab_size, tokens)
    assert tokenizer is not None
    config_file = checkpoint.path / "config.json"
    if checkpoint.one_file:  # a GGUF file: MAX reads a directory made for it
        return model_directory(checkpoint, tokenizer, ARCHITECTURE, default_cache_dir())
    if not checkpoint.path.is_dir():
        raise ValueError(f"--checkpoint {path}: serving needs the checkpoint's directory, not a file in it")
    if ARCHITECTURE not in (named := json.loads(config_file.read_text()).get("architectures") or []):
        raise ValueError(
            f"{config_file} names the architectures {named}, and MAX picks the model by that list: add "
            f'"architectures": ["{ARCHITECTURE}"] (save_pretrained writes it)'
        )
    return checkpoint.path.resolve()


def server_environment(
    args: argparse.Namespace, progress: Progress, settings: ServingSettings, api_key: str | None
) -> dict[str, str]:
    """MAX's processes' environment: this one's, our settings in their variable and the key in its own
    (ours decide, not what the environment held), the package on the path, offline, telemetry off
    unless `--telemetry`."""
    # MAX's model worker is a fresh interpreter that must import max_gpt2; an editable
    # install is not always visible to it (seen here), an explicit path always is.
    paths = [str(PACKAGE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "HF_HUB_OFFLINE": "1",
        **settings.environment(),
    }
    env.pop(API_KEY_VARIABLE, None)
    if not args.telemetry:
        env.update(TELEMETRY_OFF)
    if api_key:
        env[API_KEY_VARIABLE] = api_key  # not on the command line, where every user of the machine reads it
    elif not is_loopback(args.host):
        progress.note(
            f"warning: --host {args.host} lets other machines reach the model, and no --api-key is set: "
            f"anyone who can reach port {args.port} can use it"
        )
    return env
