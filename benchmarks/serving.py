"""Serving side by side: `max-gpt2 serve`, our in-process `generate`, and llama.cpp's `llama-server`.

    python benchmarks/serving.py                       # the demo checkpoint, CPU, 1/4/16/64 clients
    python benchmarks/serving.py --checkpoint DIR --llama-server build/bin/llama-server --gguf f32.gguf
    python benchmarks/serving.py --checkpoint DIR --weight-format q4_0 --llama-server ... --gguf q4_0.gguf

For each number of clients C, C threads each send `--requests` streamed
completions one after another (greedy, `--max-tokens` new tokens, end-of-text
ignored so every request makes them all, a prompt of `--prompt-tokens` tokens of
the text we ship). Reported per C: generated tokens/s and requests/s over the
wall time; time to first token (TTFT) and inter-token latency (ITL: the gaps
between a request's streamed chunks, as a client sees them), median and p95, and
the time a token (a request's last arrival less its first, over its tokens less
one): our server sends up to `--decode-steps` tokens a chunk (the server's default
unless given; `--decode-steps 1,4` runs our server once with each, side by side).
`--weight-format` serves the projections and the LM head packed (`max-gpt2 serve
--weight-format`); `generate` then runs the same format with its default KV cache
(float16 beside packed weights, where the server's paged cache is float32), and
`--gguf` should be the same format's GGUF.

Beside it, in the same run, one after the other on a quiet machine: given
`--llama-server` and `--gguf` (the same weights, converted by
`benchmarks/llama_cpp_gguf.py`), llama.cpp's server with as many slots as the
most clients (`-np`), 2 threads, prompt cache off, the same requests; then, once
no server runs, our in-process `lm.generate` on a batch of min(C, the server's
batch) copies of the prompt, three times (tokens/s over their wall time, prefill
included, as the server's is), in a child process that ends with it. The VM's memory speed
moves by 10-30 % within minutes, so `--rounds N` repeats the three in turn, each
server started afresh: the table gives each contender's median over the rounds
and each ratio as the median of the same round's ratios (with their range).
JSON goes to `--output`. Needs the serving extra (`pip install -e '.[serve]'`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from serving_clients import run_clients, streamed_request  # this folder's

from max_gpt2 import load_lm
from max_gpt2.bench.harness import machine_description
from max_gpt2.bench.server import ServerProcess, free_port, stop_group, wait_for_health
from max_gpt2.cli.console import demo_checkpoint
from max_gpt2.cli.serve import require_serve_extra
from max_gpt2.inference.devices import resolve_device
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.formats import FORMATS
from max_gpt2.outputs import Progress, default_cache_dir, write_atomically
from max_gpt2.serving.memory_planner import CPU_BATCH_SIZE
from max_gpt2.testing import CORPUS


def in_process(
    checkpoint: Path, prompt_ids: list[int], batches: list[int], max_tokens: int, weights: str
) -> dict[int, float]:
    """`lm.generate`'s tokens/s at each batch: new tokens over the wall time of 3 generations, prefill
    included, as a server's are its tokens over its run's wall time (not the fastest of the 3: that
    took generate's best moment against the server's whole run)."""
    lm = load_lm(checkpoint, "cpu", weight_format=weights)
    lm.generate(np.array([prompt_ids]), 2)  # warm-up
    rates = {}
    for batch in batches:
        ids = np.array([prompt_ids] * batch)
        start = time.perf_counter()
        for _ in range(3):
            lm.generate(ids, max_tokens)
        rates[batch] = 3 * batch * max_tokens / (time.perf_counter() - start)
    return rates


def in_child_process(
    checkpoint: Path, prompt_ids: list[int], batches: list[int], max_tokens: int, weights: str
) -> dict[int, float]:
    """`in_process` in a child process: a model loaded keeps a MAX runtime thread waking in its
    process (~7 % of a core on 2 cores), CPU it would take from the next round's servers."""
    # Importing max.pipelines sets PYTHONEXECUTABLE in the C environment (os.environ never shows
    # it): a spawned child would start outside this virtual environment, without max_gpt2.
    os.unsetenv("PYTHONEXECUTABLE")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(in_process, checkpoint, prompt_ids, batches, max_tokens, weights).result()


def serve_and_measure(
    url: str, model: str, args: argparse.Namespace, prompt: str, progress: Progress
) -> list[dict]:
    streamed_request(url, model, prompt, 4)  # warm-up, untimed
    runs = []
    for clients in args.clients:
        with progress.step(f"{model}: {clients} client(s) x {args.requests} requests"):
            runs.append(run_clients(url, model, clients, args.requests, prompt, args.max_tokens))
    return runs


def start_llama_server(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen:
    slots = max(args.clients)
    command = [str(args.llama_server), "-m", str(args.gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", str(args.threads), "-tb", str(args.threads), "-np", str(slots), "-c", str(slots * 256)]
    command += ["--no-cache-prompt", "--no-warmup"]
    with log.open("w") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def median_run(runs: list[dict]) -> dict:
    """One contender's runs at one number of clients, over the rounds: the median of each figure."""
    return {
        "tokens_per_second": statistics.median(run["tokens_per_second"] for run in runs),
        "requests_per_second": statistics.median(run["requests_per_second"] for run in runs),
        **{
            latency: {q: statistics.median(run[latency][q] for run in runs) for q in ("median", "p95")}
            for latency in ("ttft_ms", "itl_ms", "tpot_ms")
        },
    }


def ratio(numerators: list[float], denominators: list[float]) -> str:
    """The median of the rounds' ratios, with their range when there are several."""
    ratios = sorted(a / b for a, b in zip(numerators, denominators, strict=True))
    spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}{spread}"


def table(report: dict) -> str:
    lines = [
        "| clients | contender | tokens/s | vs in-process generate | vs llama-server | requests/s "
        "| TTFT median / p95 ms | ITL median / p95 ms | time a token median / p95 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rounds = report["rounds"]
    for contender in rounds[0]["servers"]:
        for i, clients in enumerate(report["clients"]):
            runs = [round_["servers"][contender][i] for round_ in rounds]
            rates = [run["tokens_per_second"] for run in runs]
            batch = min(clients, report["server_batch"])
            generate = [round_["in_process_tokens_per_second"][str(batch)] for round_ in rounds]
            against_llama = "-"
            if contender != "llama-server" and "llama-server" in rounds[0]["servers"]:
                llama = [round_["servers"]["llama-server"][i]["tokens_per_second"] for round_ in rounds]
                against_llama = ratio(rates, llama)
            run = median_run(runs)
            lines.append(
                f"| {clients} | {contender} | {run['tokens_per_second']:.1f} "
                f"| {ratio(rates, generate)} (x{batch}: {statistics.median(generate):.1f} tok/s) "
                f"| {against_llama} | {run['requests_per_second']:.2f} "
                f"| {run['ttft_ms']['median']:.0f} / {run['ttft_ms']['p95']:.0f} "
                f"| {run['itl_ms']['median']:.1f} / {run['itl_ms']['p95']:.1f} "
                f"| {run['tpot_ms']['median']:.1f} / {run['tpot_ms']['p95']:.1f} |"
            )
    return "\n".join(lines)


def measure_round(
    checkpoint: Path, args: argparse.Namespace, prompt_ids: list[int], prompt: str, progress: Progress
) -> dict[str, Any]:
    """Our server, then llama-server (if given), then in-process `generate`, one after the other."""
    servers = {}
    log = args.output.with_suffix(".server.log")
    options = (
        "--device",
        "cpu",
        "--max-batch-size",
        str(args.max_batch_size),
        "--weight-format",
        args.weight_format,
    )
    for steps in args.decode_steps or [None]:
        name, steps_option = (
            ("max-gpt2 serve", ())
            if steps is None
            else (f"max-gpt2 serve, {steps} a step", ("--decode-steps", str(steps)))
        )
        server = ServerProcess(checkpoint, log, free_port(), *options, *steps_option)
        try:
            with progress.step(f"starting {name} (compiles on first use; log: {log})"):
                server.wait_until_ready(timeout=1800)
            servers[name] = serve_and_measure(server.url, "gpt2", args, prompt, progress)
        finally:
            server.stop()
    if args.llama_server:
        port, llama_log = free_port(), args.output.with_suffix(".llama-server.log")
        llama = start_llama_server(args, port, llama_log)
        try:
            with progress.step(f"starting llama-server (log: {llama_log})"):
                wait_for_health(f"http://127.0.0.1:{port}", llama, timeout=300)
            url = f"http://127.0.0.1:{port}"
            servers["llama-server"] = serve_and_measure(url, "gguf", args, prompt, progress)
        finally:
            stop_group(llama.pid, llama.poll)
    batches = sorted({min(clients, args.max_batch_size) for clients in args.clients})
    with progress.step(f"in-process generate at batch {', '.join(map(str, batches))}"):
        rates = in_child_process(checkpoint, prompt_ids, batches, args.max_tokens, args.weight_format)
    return {"servers": servers, "in_process_tokens_per_second": {str(b): rate for b, rate in rates.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", type=Path, help="GPT-2 directory with a tokenizer (default: the demo one)"
    )
    parser.add_argument(
        "--clients", default="1,4,16,64", help="numbers of concurrent clients (default: 1,4,16,64)"
    )
    parser.add_argument("--requests", type=int, default=2, help="requests per client (default: 2)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=CPU_BATCH_SIZE, help="the server's batch")
    parser.add_argument(
        "--weight-format", default="float32", choices=FORMATS, help="how ours store the projections and head"
    )
    parser.add_argument(
        "--decode-steps",
        help="our server once for each of these `max-gpt2 serve --decode-steps` (e.g. 1,4; default: its own)",
    )
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    parser.add_argument("--gguf", type=Path, help="the same checkpoint in GGUF, for --llama-server")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads (default: 2)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the contenders in turn (default: 1)")
    parser.add_argument("--output", type=Path, default=Path("bench-results/serving.json"))
    args = parser.parse_args()
    args.clients = [int(n) for n in args.clients.split(",")]
    args.decode_steps = [int(n) for n in args.decode_steps.split(",")] if args.decode_steps else None
    if args.decode_steps and min(args.decode_steps) < 1:
        parser.error(f"--decode-steps must be 1 or more each, got {args.decode_steps}")
    if (args.llama_server is None) != (args.gguf is None):
        parser.error("--llama-server and --gguf go together")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    require_serve_extra()
    progress = Progress(sys.stderr)
    checkpoint = args.checkpoint or demo_checkpoint(default_cache_dir(), 0, progress)
    tokenizer = load_tokenizer(checkpoint)
    prompt_ids = tokenizer.encode(CORPUS.read_text()).ids[: args.prompt_tokens]
    prompt = tokenizer.decode(prompt_ids)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": machine_description(resolve_device("cpu")),
        "checkpoint": str(checkpoint),
        "server_batch": args.max_batch_size,
        "weights": args.weight_format,
        "prompt_tokens": len(prompt_ids),
        "max_tokens": args.max_tokens,
        "clients": args.clients,
        "rounds": [],
    }
    for number in range(1, args.rounds + 1):
        progress.note(f"round {number} of {args.rounds}")
        report["rounds"].append(measure_round(checkpoint, args, prompt_ids, prompt, progress))
    print(table(report))
    write_atomically(args.output, lambda file: file.write_text(json.dumps(report, indent=2) + "\n"))
    progress.note(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
