"""Time to the first token of a prompt whose prefix the server's cache holds, beside one prefilled whole.

    python benchmarks/prefix_reuse.py --checkpoint DIR [--prefix 900 --question 16 --rounds 10]

DIR: GPT-2 small's shapes, with a tokenizer covering its vocabulary (prompts go as token ids). It
starts `max-gpt2 serve` on DIR (prefix caching on, its default) and, each round, streams two
prompts with `max_tokens: 1`: a new prefix of `--prefix` random ids and a question of `--question`
(cold: nothing of it cached), then the same prefix with another question (warm: the prefix's full
pages read from MAX's cache), timing each to its first chunk. Prints the machine, the medians, the
median of the rounds' ratios (warm over cold) and the prompt tokens the warm requests read cached.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import openai

from max_gpt2.bench.harness import machine_description
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.inference.devices import resolve_device
from max_gpt2.model.config import GPT2Config


def first_token(client: openai.OpenAI, prompt: list[int]) -> tuple[float, int]:
    """Seconds from sending `prompt` to its first streamed token, and its `cached_tokens`."""
    started, first, cached = time.perf_counter(), None, -1
    options = {"include_usage": True}
    for chunk in client.completions.create(
        model="gpt2", prompt=prompt, max_tokens=1, temperature=0, stream=True, stream_options=options
    ):
        if first is None and chunk.choices:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    assert first is not None, "the stream held no token"
    return first, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--prefix", type=int, default=900)
    parser.add_argument("--question", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    vocab = GPT2Config.from_pretrained(args.checkpoint).vocab_size
    print(machine_description(resolve_device("cpu")), flush=True)
    log = Path(tempfile.mkdtemp(prefix="prefix-reuse-")) / "server.log"
    server = ServerProcess(Path(args.checkpoint), log, free_port(), "--device", "cpu")
    try:
        server.wait_until_ready(timeout=1800)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        rng = np.random.default_rng(0)
        ids = lambda count: rng.integers(0, vocab, count).tolist()  # noqa: E731
        first_token(client, ids(args.prefix + args.question))  # the first request of a server pays extra
        cold, warm, cached = [], [], []
        for _ in range(args.rounds):
            prefix = ids(args.prefix)
            cold.append(first_token(client, prefix + ids(args.question))[0])
            seconds, tokens = first_token(client, prefix + ids(args.question))
            warm.append(seconds)
            cached.append(tokens)
    finally:
        server.stop()
    ratios = [w / c for w, c in zip(warm, cold, strict=True)]
    print(f"prompt: {args.prefix} shared + {args.question} new tokens, {args.rounds} rounds")
    print(f"first token, cold (prefilled whole): {statistics.median(cold) * 1e3:.0f} ms")
    print(f"first token, warm (prefix cached):   {statistics.median(warm) * 1e3:.0f} ms")
    print(f"warm / cold: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    print(f"cached_tokens of the warm requests: {sorted(set(cached))}")


if __name__ == "__main__":
    main()
