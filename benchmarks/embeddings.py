"""Embeddings served: `max-gpt2 serve --embeddings` beside llama-server `--embeddings`, same weights.

    python benchmarks/embeddings.py --checkpoint DIR --llama-server BUILD/bin/llama-server \
        [--texts 16 --tokens 128 --rounds 10 --pooling mean --slots 16]

DIR: a checkpoint with a tokenizer (the texts go as token ids). llama-server reads DIR converted to
an F32 GGUF file (`max-gpt2 convert`), with `-t 2` and `--slots` slots (`-np`; by default one a
text), each with room for a whole context. Each round sends one request of `--texts` random texts of
`--tokens` ids to each server, in turn (which first alternates), and times it whole; the first round
checks that the two servers' vectors agree. Prints the machine, each side's texts a second
(medians), and the median of the rounds' ratios (ours over llama-server's rate) with the middle half
of them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from max_gpt2.bench.harness import in_turn, machine_description, ratio_summary
from max_gpt2.bench.server import ServerProcess, free_port, stop_group, wait_for_health
from max_gpt2.inference.devices import resolve_device
from max_gpt2.model.config import GPT2Config


def embedded(url: str, texts: list[list[int]]) -> tuple[float, np.ndarray]:
    """Seconds for one request of `texts` to `url`'s /v1/embeddings, and its vectors."""
    started = time.perf_counter()
    answer = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=600)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    return seconds, np.array([item["embedding"] for item in answer.json()["data"]])


def llama_server(binary: str, checkpoint: str, pooling: str, slots: int, context: int, scratch: Path):
    """llama-server on `checkpoint` as an F32 GGUF file, with `slots` slots; (process, url) once healthy."""
    gguf = scratch / "model.gguf"
    convert = [sys.executable, "-m", "max_gpt2", "convert", "--checkpoint", checkpoint, "--out", str(gguf)]
    subprocess.run(convert, check=True, capture_output=True)
    port = free_port()
    command = [binary, "-m", str(gguf), "--port", str(port), "-t", "2", "--embeddings", "--pooling", pooling]
    command += ["-np", str(slots), "-c", str(slots * context)]
    with (scratch / "llama-server.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url, process, 300)
    return process, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pooling", choices=["last", "mean"], default="mean")
    parser.add_argument("--slots", type=int, help="llama-server's -np (default: --texts)")
    args = parser.parse_args()
    config = GPT2Config.from_pretrained(args.checkpoint)
    print(machine_description(resolve_device("cpu")), flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="embeddings-bench-"))
    ours = ServerProcess(
        Path(args.checkpoint), scratch / "ours.log", free_port(), "--device", "cpu", "--embeddings",
        "--pooling", args.pooling, "--max-batch-size", str(args.texts),
    )  # fmt: skip
    theirs = None
    try:
        ours.wait_until_ready(timeout=1800)
        theirs, their_url = llama_server(
            args.llama_server,
            args.checkpoint,
            args.pooling,
            args.slots or args.texts,
            config.n_positions,
            scratch,
        )
        rng = np.random.default_rng(0)
        urls = {"ours": ours.url, "llama-server": their_url}
        rates: dict[str, list[float]] = {name: [] for name in urls}
        for round_ in range(args.rounds + 1):  # the first warms both up and is not counted
            texts = rng.integers(0, config.vocab_size, (args.texts, args.tokens)).tolist()
            timed = {name: embedded(urls[name], texts) for name in in_turn(list(urls), round_)}
            if round_ == 0:
                gap = np.abs(timed["ours"][1] - timed["llama-server"][1]).max()
                print(f"largest difference between the two servers' vectors: {gap:.2e}", flush=True)
                continue
            for name, (seconds, _) in timed.items():
                rates[name].append(args.texts / seconds)
        ratios = [a / b for a, b in zip(rates["ours"], rates["llama-server"], strict=True)]
        print(
            f"{args.texts} texts of {args.tokens} tokens, {args.pooling} pooling, llama-server -np "
            f"{args.slots or args.texts}, {args.rounds} rounds: "
            f"ours {statistics.median(rates['ours']):.1f} texts/s, llama-server "
            f"{statistics.median(rates['llama-server']):.1f}; ours / llama-server "
            f"{ratio_summary(ratios)}"
        )
    finally:
        ours.stop()
        if theirs is not None:
            stop_group(theirs.pid, theirs.poll)


if __name__ == "__main__":
    main()
