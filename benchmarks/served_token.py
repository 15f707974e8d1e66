"""One client's tokens through `max-gpt2 serve` beside `lm.generate` in process, pair by pair.

    python benchmarks/served_token.py --checkpoint DIR [--tokens 128 --pairs 8]

DIR: a GPT-2 checkpoint with a tokenizer covering its vocabulary. It starts `max-gpt2 serve` on
DIR and loads the same checkpoint here (`load_lm`), then times pairs: one streamed greedy completion
of `--tokens` tokens (end-of-text ignored) through the `openai` client, and `lm.generate` of as
many on the same prompt, which of the two goes first alternating pair by pair (the VM's speed moves
by 10-30 % within minutes; a pair is seconds apart). Each side's time is a request's whole time
over its tokens, its first token included; the server idles while `generate` runs and the reverse.
Prints the machine, each side's median milliseconds a token and the median of the pairs' ratios
(served tokens/s over in-process) with their range. `benchmarks/serving.py` measures many clients
and llama-server beside them; this measures what serving costs one client, token by token.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import openai

from max_gpt2 import load_lm
from max_gpt2.bench.harness import in_turn, machine_description
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.inference.devices import resolve_device

PROMPT = "The sky is blue and the grass is green. " * 3


def served(client: openai.OpenAI, tokens: int) -> float:
    """Milliseconds a token of one streamed greedy completion of `tokens` tokens."""
    started, made = time.perf_counter(), 0
    for chunk in client.completions.create(
        model="gpt2",
        prompt=PROMPT,
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if chunk.usage is not None:
            made = chunk.usage.completion_tokens
    assert made == tokens, f"the server made {made} tokens, not {tokens}"
    return (time.perf_counter() - started) * 1e3 / made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    print(machine_description(resolve_device("cpu")), flush=True)
    log = Path(tempfile.mkdtemp(prefix="served-token-")) / "server.log"
    server = ServerProcess(Path(args.checkpoint), log, free_port(), "--device", "cpu")
    try:
        lm = load_lm(args.checkpoint, device="cpu")
        ids = np.array([lm.tokenizer.encode(PROMPT).ids])

        def in_process() -> float:
            started = time.perf_counter()
            lm.generate(ids, args.tokens)
            return (time.perf_counter() - started) * 1e3 / args.tokens

        server.wait_until_ready(timeout=1800)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        served(client, 8)  # each side's first call pays extra
        in_process()
        sides = {"here": in_process, "there": lambda: served(client, args.tokens)}
        pairs = []
        for pair in range(args.pairs):
            times = {side: sides[side]() for side in in_turn(list(sides), pair)}
            here, there = times["here"], times["there"]
            pairs.append((here, there))
            print(f"pair {pair + 1}: in process {here:.2f} ms a token, served {there:.2f}", flush=True)
    finally:
        server.stop()
    ratios = [here / there for here, there in pairs]
    print(f"{args.tokens} tokens a request, {args.pairs} pairs")
    print(f"in process: {statistics.median(here for here, _ in pairs):.2f} ms a token")
    print(f"served:     {statistics.median(there for _, there in pairs):.2f} ms a token")
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
    print(f"served / in process (tokens/s): median {statistics.median(ratios):.3f} ({spread})")


if __name__ == "__main__":
    main()
