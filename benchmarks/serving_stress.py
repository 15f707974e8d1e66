"""Greedy requests at random times against `max-gpt2 serve`, each checked against `lm.generate` alone.

    python benchmarks/serving_stress.py                         # a small random model, 300 rounds
    python benchmarks/serving_stress.py --beside-cold-server    # the load under which it fails
    python benchmarks/serving_stress.py --checkpoint DIR --rounds 50 --seed 3

A round sends 4-24 completions, each from its own thread after a random delay
(0-1 s): a prompt of 1-40 random token ids, 1 to (context - prompt) new tokens,
temperature 0. Every completion's token ids must be what `lm.generate` gives for
that prompt alone (end-of-text included, as the server lists it); a mismatch is
printed with the request's id, its prompt and where it first differs, and the run
exits 1. Without `--checkpoint` the model is a seeded random one of the test
suite's serving shapes (60 wide, 5 heads, 3 layers, 48 positions, 320 tokens;
compiles in a few minutes, then from MAX's cache).

`--beside-cold-server` starts a second server (q4_0 weights) on an empty MAX cache
at the same time, so that it compiles for minutes beside the checked one, as the
test suite's second server does. On a 2-core EPYC (2026-11-27) that load gave
wrong tokens in about 1 of 3,500 requests; quiet, or beside two busy loops, none
in thousands (benchmarks/README.md, "A wrong token under load").
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from max_gpt2 import GPT2Config, load_lm
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.outputs import Progress, write_atomically
from max_gpt2.testing import END_OF_TEXT, write_checkpoint

SERVING_SHAPES = GPT2Config(n_embd=60, n_head=5, n_layer=3, n_positions=48, vocab_size=320)


def complete(url: str, prompt: list[int], max_tokens: int) -> tuple[str, list[int]]:
    """One greedy completion of token ids: (the server's request id, the new token ids)."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=600)
    body = {
        "model": "gpt2",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    answer = json.loads(connection.getresponse().read())
    if "choices" not in answer:
        raise RuntimeError(f"the server refused a completion of {prompt}: {answer}")
    return answer["id"], answer["choices"][0]["token_ids"] or []


def first_difference(got: list[int], want: list[int]) -> int:
    """The index of the first token where two completions differ (the shorter's length if one is a prefix)."""
    return next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
    )


def random_round(rng: random.Random, ordinary: list[int], context: int) -> list[tuple[list[int], int, float]]:
    """A round's requests: (prompt ids, new tokens, seconds before sending)."""
    requests = []
    for _ in range(rng.randint(4, 24)):
        prompt = [rng.choice(ordinary) for _ in range(rng.randint(1, min(40, context - 1)))]
        requests.append((prompt, rng.randint(1, context - len(prompt)), rng.uniform(0, 1)))
    return requests


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint", type=Path, help="a checkpoint with a tokenizer (default: a random small one)"
    )
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="of the rounds' prompts, lengths and delays")
    parser.add_argument(
        "--beside-cold-server", action="store_true", help="a second server compiling meanwhile"
    )
    parser.add_argument("--max-batch-size", type=int, help="of the checked server (default: its own)")
    parser.add_argument("--output", type=Path, help="JSON summary, with every mismatch")
    args = parser.parse_args()
    progress = Progress(sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="max-gpt2-stress-"))
    checkpoint = args.checkpoint or write_checkpoint(
        scratch / "model", SERVING_SHAPES, seed=0, tokenizer=True
    )
    tokenizer = load_tokenizer(checkpoint)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    lm = load_lm(checkpoint, "cpu")
    context = lm.config.n_positions
    ordinary = [token for token in range(lm.config.vocab_size) if token != eos]  # prompt tokens

    expected: dict[tuple[int, ...], list[int]] = {}

    def reference(prompt: list[int], max_tokens: int) -> list[int]:
        """`lm.generate` alone, to the context's end once per prompt, cut where the server stops."""
        if tuple(prompt) not in expected:
            new = lm.generate(np.array([prompt]), context - len(prompt), eos_token_id=eos)[0, len(prompt) :]
            new = new.tolist()
            expected[tuple(prompt)] = new[: new.index(eos) + 1] if eos in new else new
        return expected[tuple(prompt)][:max_tokens]

    batch = ("--max-batch-size", str(args.max_batch_size)) if args.max_batch_size else ()
    server = ServerProcess(checkpoint, scratch / "server.log", free_port(), "--device", "cpu", *batch)
    servers = [server]
    mismatches: list[dict[str, Any]] = []
    try:
        with progress.step(f"starting max-gpt2 serve (log: {server.log})"):
            server.wait_until_ready(timeout=1800)
        if args.beside_cold_server:
            cold = {"XDG_CACHE_HOME": str(scratch / "empty-cache")}
            servers.append(
                ServerProcess(checkpoint, scratch / "cold.log", free_port(), "--weights", "q4_0", env=cold)
            )
            progress.note(f"a second server compiles on an empty cache beside it (log: {servers[1].log})")

        def send(request: tuple[list[int], int, float]) -> tuple[str, list[int]]:
            prompt, max_tokens, delay = request
            time.sleep(delay)
            return complete(server.url, prompt, max_tokens)

        rng = random.Random(args.seed)
        sent = 0
        start = time.monotonic()
        for number in range(args.rounds):
            requests = random_round(rng, ordinary, context)
            with ThreadPoolExecutor(len(requests)) as pool:
                answers = list(pool.map(send, requests))
            for (prompt, max_tokens, delay), (request_id, got) in zip(requests, answers, strict=True):
                want = reference(prompt, max_tokens)
                if got != want:
                    mismatches.append(
                        {
                            "round": number,
                            "id": request_id,
                            "prompt": prompt,
                            "delay": round(delay, 3),
                            "first_difference": first_difference(got, want),
                            "got": got,
                            "want": want,
                        }
                    )
                    progress.note(f"MISMATCH {mismatches[-1]}")
            sent += len(requests)
            progress.note(f"round {number + 1}/{args.rounds}: {len(mismatches)} wrong of {sent} requests")
        summary = {
            "requests": sent,
            "wrong": len(mismatches),
            "seconds": round(time.monotonic() - start, 1),
            "beside_cold_server": args.beside_cold_server,
            "max_batch_size": args.max_batch_size,
            "seed": args.seed,
            "mismatches": mismatches,
        }
        if args.output:
            write_atomically(args.output, lambda path: path.write_text(json.dumps(summary, indent=1)))
        print(json.dumps({key: value for key, value in summary.items() if key != "mismatches"}))
        return 1 if mismatches else 0
    finally:
        for each in servers:
            each.stop()
        if mismatches or sys.exc_info()[0] is not None:
            progress.note(f"the servers' logs are kept in {scratch}")
        else:
            shutil.rmtree(scratch)


if __name__ == "__main__":
    sys.exit(main())
