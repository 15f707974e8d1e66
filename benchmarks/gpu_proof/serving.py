"""Stage 3: `max-gpt2 serve` on the device, through the OpenAI client (`max_gpt2.bench.server` starts it).

Greedy completions must equal `lm.generate`'s in this process (or differ at a near tie, both logits
written down), 8 requests at once each get what they get alone, and bad requests get a 400
while the server keeps answering.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gpu_proof.correctness import first_difference
from gpu_proof.plan import Plan
from gpu_proof.precompiled import build
from gpu_proof.record import Results
from max_gpt2 import load_lm
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.cli.serve import SERVE_MODULES, missing_modules
from max_gpt2.inference.tokenizer import END_OF_TEXT

PROMPTS = ("The cat sat on", "Attention is all", "q", "What every head does")
NEW_TOKENS = 32


def serve(plan: Plan, results: Results, checkpoint: Path, log: Path, deadline: float) -> None:
    if missing := missing_modules((*SERVE_MODULES, "openai")):
        results.record("serve", "skip", reason=f"not installed here: {', '.join(missing)}")
        return
    import openai

    server = ServerProcess(checkpoint, log, free_port(), "--device", plan.device)
    try:
        results.timed(
            "server ready (compiling its graphs)",
            lambda: server.wait_until_ready(timeout=max(1.0, deadline - time.time())),
        )
        lm = build(results, "lm float32 in this process (load_lm)", lambda: load_lm(checkpoint, plan.device))
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        check_greedy_and_concurrency(lm, client, results)
        check_refusals(plan, client, results, PROMPTS[2])
    finally:
        server.stop()


def served(client: Any, prompt: Any, **options: Any) -> list[int]:
    """The greedy completion's token ids (MAX's `return_token_ids`)."""
    options = {"max_tokens": NEW_TOKENS, "temperature": 0, "extra_body": {"return_token_ids": True}} | options
    choice = client.completions.create(model="gpt2", prompt=prompt, **options).choices[0]
    return list(choice.model_extra["token_ids"] or [])


def check_greedy_and_concurrency(lm: Any, client: Any, results: Results) -> None:
    tokenizer = lm.tokenizer
    eos = tokenizer.token_to_id(END_OF_TEXT)  # MAX stops at the tokenizer's, and returns its id

    def generated(prompt: str) -> list[int]:
        ids = tokenizer.encode(prompt).ids
        new = lm.generate(np.array([ids]), NEW_TOKENS, eos_token_id=eos)[0, len(ids) :].tolist()
        return new[: new.index(eos) + 1] if eos in new else new

    expected = {prompt: generated(prompt) for prompt in PROMPTS}
    alone = {prompt: served(client, prompt) for prompt in PROMPTS}
    differences = [
        first_difference(lm, tokenizer.encode(prompt).ids, alone[prompt], expected[prompt])
        for prompt in PROMPTS
        if alone[prompt] != expected[prompt]
    ]
    results.outcome(
        f"serve: greedy completions of {len(PROMPTS)} prompts equal lm.generate's",
        all(difference["near_tie"] for difference in differences),
        differing=differences,
        tokens=sum(map(len, alone.values())),
    )
    start = time.perf_counter()
    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
        together = list(pool.map(lambda prompt: served(client, prompt), PROMPTS * 2))
    seconds = time.perf_counter() - start
    results.outcome(
        f"serve: {2 * len(PROMPTS)} requests at once each get what they get alone",
        together == [alone[prompt] for prompt in PROMPTS * 2],
        seconds=round(seconds, 2),
        tokens_per_second=round(sum(map(len, together)) / seconds, 1),
    )


def check_refusals(plan: Plan, client: Any, results: Results, prompt: str) -> None:
    import openai

    answers = {}
    before = served(client, prompt)
    for name, request in (
        ("logprobs=21", {"prompt": prompt, "logprobs": 21}),
        (f"a token id of {plan.lm.vocab_size}", {"prompt": [plan.lm.vocab_size]}),
    ):
        try:
            client.completions.create(model="gpt2", max_tokens=4, **request)
            answers[name] = "200"
        except openai.APIStatusError as error:
            answers[name] = f"{error.status_code}: {str(error)[:200]}"
        except openai.APIError as error:
            answers[name] = f"{type(error).__name__}: {str(error)[:200]}"
    still = served(client, prompt) == before
    results.outcome(
        "serve: bad requests get a 400 and the server goes on",
        all(answer.startswith("400") for answer in answers.values()) and still,
        answers=answers,
        same_completion_after=still,
    )
