"""Clients of an OpenAI completions server, as `benchmarks/serving.py` runs them against ours and llama.cpp's.

`run_clients` starts C threads, each streaming its completions one after another, and returns
tokens/s, requests/s, time to first token, the gaps between streamed chunks and the time a token,
median and p95.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import numpy as np


def percentile(values: list[float], share: float) -> float:
    return float(np.percentile(values, 100 * share)) if values else float("nan")


ROUTES = {  # each route's path, and the body of a streamed request there
    # OpenAI's, greedy
    "openai": (
        "/v1/completions",
        lambda model, prompt, tokens: {
            "model": model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
        },
    ),
    # llama-server's own, sampled with its defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05)
    "native": ("/completion", lambda model, prompt, tokens: {"prompt": prompt, "n_predict": tokens}),
}


def streamed_request(
    url: str, model: str, prompt: str, max_tokens: int, route: str = "openai"
) -> dict[str, Any]:
    """One streamed completion (`ROUTES[route]` at `url`): when each token arrived (seconds after sending).

    Plain HTTP and JSON, not the `openai` client: turning each chunk into its models took ~1 ms
    of CPU a token on a 2-core machine (this: ~0.3 ms), CPU taken from the server being measured."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=600)
    path, body_of = ROUTES[route]
    body = {**body_of(model, prompt, max_tokens), "stream": True, "ignore_eos": True}  # all `max_tokens`
    start = time.perf_counter()
    arrivals = []
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{url}{path}: HTTP {response.status}: {response.read(500)!r}")
        for line in response:  # server-sent events: `data: {json}` lines (OpenAI's, then `data: [DONE]`)
            if line.startswith(b"data: {"):
                event = json.loads(line[len(b"data: ") :])
                choices = event.get("choices") or [{"text": event.get("content")}]  # llama-server's: content
                if choices[0]["text"]:
                    arrivals.append(time.perf_counter() - start)
    finally:
        connection.close()
    return {"arrivals": arrivals, "seconds": time.perf_counter() - start}


def run_clients(
    url: str, model: str, clients: int, requests: int, prompt: str, max_tokens: int, route: str = "openai"
) -> dict:
    """`clients` threads, each streaming `requests` completions in turn (`ROUTES[route]`): throughput and
    latencies."""

    def one_client(_: int) -> list[dict[str, Any]]:
        return [streamed_request(url, model, prompt, max_tokens, route) for _ in range(requests)]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = [request for result in pool.map(one_client, range(clients)) for request in result]
    wall = time.perf_counter() - start
    first = [request["arrivals"][0] for request in done if request["arrivals"]]
    gaps = [float(gap) for request in done for gap in np.diff(request["arrivals"])]
    # A chunk may bring several tokens (`--decode-steps`): the time a token, first to last, per request.
    per_token = [(r["arrivals"][-1] - r["arrivals"][0]) / (max_tokens - 1) for r in done if r["arrivals"]]
    chunks = sum(len(request["arrivals"]) for request in done)
    return {
        "clients": clients,
        "requests": len(done),
        "seconds": wall,
        "requests_per_second": len(done) / wall,
        "tokens_per_second": len(done) * max_tokens / wall,
        "chunks": chunks,  # streamed pieces of text: a token each, but bytes that are not yet UTF-8 wait
        "ttft_ms": {"median": 1e3 * statistics.median(first), "p95": 1e3 * percentile(first, 0.95)},
        "itl_ms": {"median": 1e3 * statistics.median(gaps), "p95": 1e3 * percentile(gaps, 0.95)},
        "tpot_ms": {"median": 1e3 * statistics.median(per_token), "p95": 1e3 * percentile(per_token, 0.95)},
    }
