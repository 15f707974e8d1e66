"""Our GPT-2 behind `max serve`: requests/s and tokens/s at several numbers of concurrent clients.

    python benchmarks/serving.py                       # the GPT-2-small-shaped demo checkpoint, CPU
    python benchmarks/serving.py --checkpoint ~/models/gpt2 --clients 1,4,16 --device gpu --dtype bfloat16

Starts `max-gpt2 serve` (`max_gpt2.cli.serve.ServerProcess`), waits until it
answers, sends one untimed request, then for each number of clients C runs C
threads that each send `--requests` completions one after another (greedy,
`--max-tokens` new tokens after a prompt of about `--prompt-tokens` tokens) and
reports requests/s, generated tokens/s (the server's own `usage` counts), and
median and slowest latency. JSON goes to `--output`. Needs the serving extra
(`pip install -e '.[serve]'`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from max_gpt2.bench.harness import machine_description
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.cli.console import demo_checkpoint
from max_gpt2.cli.serve import require_serve_extra
from max_gpt2.inference.devices import resolve_device
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.outputs import Progress, default_cache_dir
from max_gpt2.testing import CORPUS


def prompt_of(checkpoint: Path, tokens: int) -> str:
    """The start of the text we ship, cut to about `tokens` tokens by the checkpoint's tokenizer."""
    tokenizer = load_tokenizer(checkpoint)
    ids = tokenizer.encode(CORPUS.read_text()).ids[:tokens]
    return tokenizer.decode(ids)


def run_clients(client: openai.OpenAI, clients: int, requests: int, prompt: str, max_tokens: int) -> dict:
    """`clients` threads, each sending `requests` completions in turn; throughput and latency."""

    def one_client(_: int) -> list[tuple[float, int]]:
        timings = []
        for _ in range(requests):
            start = time.perf_counter()
            reply = client.completions.create(
                model="gpt2", prompt=prompt, max_tokens=max_tokens, temperature=0
            )
            timings.append((time.perf_counter() - start, reply.usage.completion_tokens))
        return timings

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        timings = [timing for result in pool.map(one_client, range(clients)) for timing in result]
    wall = time.perf_counter() - start
    latencies = [seconds for seconds, _ in timings]
    return {
        "clients": clients,
        "requests": len(timings),
        "seconds": wall,
        "requests_per_second": len(timings) / wall,
        "tokens_per_second": sum(tokens for _, tokens in timings) / wall,
        "median_latency_ms": 1e3 * statistics.median(latencies),
        "max_latency_ms": 1e3 * max(latencies),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", type=Path, help="GPT-2 directory with a tokenizer (default: the demo one)"
    )
    parser.add_argument("--clients", default="1,4,16", help="numbers of concurrent clients (default: 1,4,16)")
    parser.add_argument("--requests", type=int, default=4, help="requests per client (default: 4)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--output", type=Path, default=Path("bench-results/serve.json"))
    args = parser.parse_args()
    require_serve_extra()
    progress = Progress(sys.stderr)
    checkpoint = args.checkpoint or demo_checkpoint(default_cache_dir(), 0, progress)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    log = args.output.with_suffix(".server.log")
    server = ServerProcess(checkpoint, log, free_port(), "--device", args.device, "--dtype", args.dtype)
    machine = machine_description(resolve_device(args.device))
    report: dict[str, Any] = {"machine": machine, "checkpoint": str(checkpoint), "runs": []}
    try:
        with progress.step(f"starting the server (compiles on first use; log: {log})"):
            report["startup_seconds"] = server.wait_until_ready(timeout=1800)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=600, max_retries=0)
        prompt = prompt_of(checkpoint, args.prompt_tokens)
        run_clients(client, 1, 1, prompt, args.max_tokens)  # warm-up, untimed
        for clients in (int(n) for n in args.clients.split(",")):
            with progress.step(f"{clients} client(s) x {args.requests} requests"):
                run = run_clients(client, clients, args.requests, prompt, args.max_tokens)
            report["runs"].append(run)
            print(
                f"{clients:3d} clients: {run['requests_per_second']:6.2f} requests/s "
                f"{run['tokens_per_second']:7.1f} tokens/s  latency median "
                f"{run['median_latency_ms']:7.0f} ms, max {run['max_latency_ms']:7.0f} ms"
            )
    finally:
        server.stop()
    args.output.write_text(json.dumps(report, indent=2))
    progress.note(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
