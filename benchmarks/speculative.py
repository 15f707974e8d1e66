"""Speculative decoding measured: what a K-token step costs, and what drafts buy, ours beside llama.cpp.

    python benchmarks/speculative.py cost --checkpoint DIR [--weight-format float32,bfloat16,q8_0,q4_0]
    python benchmarks/speculative.py lookup --checkpoint DIR [--draft DIR] [--llama-cpp BUILD --gguf FILE
        [--draft-gguf FILE]]
    python benchmarks/speculative.py serve --checkpoint DIR [--weight-format q4_0] [--llama-cpp BUILD
        --gguf FILE]

`cost`: on a cache holding a 256-token prompt, batch 1, the time of `extend` with K tokens
(K = 1..16) over a one-token `decode_step`, and a batch-8 one-token step's over it, per weight
format: what any acceptance rate can buy (a draft of K accepted whole makes K + 1 tokens for the
K-token step's time). Interleaved rounds, medians.

`lookup`: an input-grounded prompt (a passage of the checkpoint's held-out text where it has one,
else of the corpus we ship, then its first words again, which a model that copies goes on to
repeat), batch 1, greedy: plain decoding, prompt lookup (`prompt_lookup_num_tokens`) and, with
`--draft`, a draft model (`assistant_model`); and a text with nothing to look up (random tokens,
sampled with seed 0: greedy text from random weights soon loops, which drafts guess). Greedy tokens
are checked equal to plain decoding's (sampled text with and without drafts differs token for
token, alike in distribution). Decode tokens/s, from the first token on as llama.cpp's "decoded"
counts, and drafts accepted, medians of interleaved rounds. With `--llama-cpp` (a build directory
holding bin/llama-lookup) and `--gguf` (the same model as a GGUF file), llama.cpp's `llama-lookup`
on the input-grounded prompt in each round, its own figures, and with `--draft-gguf` (the draft
model as a GGUF file) its `llama-speculative` too; each one's text is checked against
`llama-completion`'s greedy text of the same prompt (drafting may run past `-n`: the shorter text
must begin the longer).

`serve`: the same input-grounded prompt sent to `max-gpt2 serve` with and without `--prompt-lookup K`
and, with `--llama-cpp` (holding bin/llama-server) and `--gguf`, to `llama-server` with and without
`--spec-type ngram-simple --spec-draft-n-max K`, all four running at once and asked in turn,
`--clients` requests at a time (1: batch 1), greedy, end-of-text ignored. Each server's text is checked
equal to its own without drafts; a request's decode tokens/s from its first streamed token to its
last, the median request's, medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from max_gpt2 import Sampler, load_lm
from max_gpt2.model.formats import FORMATS
from max_gpt2.testing import CORPUS

STEPS = 7  # a step's time: the median of this many
PROMPT = 256


def median_time(run, repeats: int = STEPS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def cost(args: argparse.Namespace) -> dict:
    """The K-token step's time over the one-token step's, per format (module docstring)."""
    results = {}
    for name in args.weight_format.split(","):
        results[name] = step_costs(load_lm(args.checkpoint, "cpu", weight_format=FORMATS[name]), args.rounds)
        print(name, json.dumps({k: round(v, 3) for k, v in results[name].items()}), flush=True)
    return results


def step_costs(lm, rounds: int) -> dict[str, float]:
    """One format's K-token steps (K = 1..16) and batch-8 step, each over the one-token step."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, lm.config.vocab_size, (1, PROMPT))
    one_row, eight_rows = lm.new_cache(1, PROMPT + 16), lm.new_cache(8, PROMPT + 16)
    lm.prefill(prompt, one_row)
    lm.prefill(np.repeat(prompt, 8, axis=0), eight_rows)

    def step(cache, tokens: np.ndarray) -> None:
        lm.extend(tokens, cache)
        cache.truncate(PROMPT)

    def timed(cache, shape: tuple[int, int]) -> float:
        return median_time(lambda: step(cache, rng.integers(0, lm.config.vocab_size, shape)))

    ratios: dict[str, list[float]] = {}
    ones = []
    for _ in range(rounds):
        ones.append(one := timed(one_row, (1, 1)))
        for k in range(1, 17):
            ratios.setdefault(str(k), []).append(timed(one_row, (1, k)) / one)
        ratios.setdefault("batch 8", []).append(timed(eight_rows, (8, 1)) / one)
    return {"one-token step ms": float(np.median(ones)) * 1e3} | {
        k: float(np.median(v)) for k, v in ratios.items()
    }


def grounded_prompt(checkpoint: Path, words: int) -> str:
    """A passage of about `words` words, then its first eight words again."""
    held_out = checkpoint / "held-out.txt"
    text = (held_out if held_out.is_file() else CORPUS).read_text()
    passage = " ".join(text.split()[:words])
    return passage + "\n\n" + " ".join(passage.split()[:8])


def lookup(args: argparse.Namespace) -> dict:
    """Plain greedy, prompt lookup and the draft model, interleaved (module docstring)."""
    lm = load_lm(args.checkpoint, "cpu", weight_format=FORMATS[args.weight_format])
    draft = load_lm(args.draft, "cpu", weight_format=FORMATS[args.weight_format]) if args.draft else None
    text = grounded_prompt(args.checkpoint, args.words)
    grounded = np.array([lm.tokenizer.encode(text).ids])
    noise = np.random.default_rng(1).integers(0, lm.config.vocab_size, grounded.shape)
    new = min(args.new_tokens, lm.config.n_positions - grounded.shape[1])
    contenders = {"plain": {}, "prompt lookup": {"prompt_lookup_num_tokens": args.k}}
    if draft is not None:
        contenders["draft model"] = {"assistant_model": draft, "num_assistant_tokens": args.k}
    results, llama, plain = {}, [], ""
    sampled = Sampler(do_sample=True, seed=0)  # text that does not loop, as random weights' greedy text does
    for case, prompt, sampler in (("input-grounded", grounded, None), ("nothing to look up", noise, sampled)):
        expected = lm.generate(prompt, new, sampler=sampler)[0]
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        counts: dict[str, tuple[int, int]] = {}
        for _ in range(args.rounds):
            for name, options in contenders.items():
                stream, chosen, times = lm.stream(prompt, new, sampler=sampler, **options), [], []
                for step in stream:
                    times.append(time.perf_counter())
                    chosen.append(step.tokens[0])
                seconds = times[-1] - times[0]  # decoding: from the first token, which the prompt gives
                same = (np.concatenate([prompt[0], chosen]) == expected).all()
                assert same or sampler is not None, f"{name} differs from plain greedy on {case}"
                rates[name].append((new - 1) / seconds)
                counts[name] = (stream.drafts.drafted, stream.drafts.accepted)
            if args.llama_cpp and args.gguf and case == "input-grounded":
                plain = plain or llama_text(args, ["llama-completion", "-no-cnv"], text, new)[0]
                runs = {"llama-lookup": llama_drafting(args, ["llama-lookup"], text, new, plain)}
                if args.draft_gguf:
                    speculative = ["llama-speculative", "-md", str(args.draft_gguf)]
                    runs["llama-speculative"] = llama_drafting(args, speculative, text, new, plain)
                llama.append(runs)
        results[case] = {
            name: {
                "tokens/s": float(np.median(r)),
                "over plain": float(np.median(np.array(r) / np.array(rates["plain"]))),
                "drafted": counts[name][0],
                "accepted": counts[name][1],
            }
            for name, r in rates.items()
        }
        results[case]["prompt tokens"] = int(prompt.shape[1])
        print(case, json.dumps(results[case]), flush=True)
    for tool in llama[0] if llama else ():
        runs = [run[tool] for run in llama]
        results[tool] = {key: float(np.nanmedian([run[key] for run in runs])) for key in runs[0]}
        results[tool]["same text"] = float(min(run["same text"] for run in runs))  # in every round
        print(tool, json.dumps(results[tool]), flush=True)
    return results


def serve(args: argparse.Namespace) -> dict:
    """Servers with and without drafting, asked in turn (module docstring)."""
    from serving_clients import streamed_request  # this folder's

    from max_gpt2.bench.server import ServerProcess, free_port, stop_group, wait_for_health

    text = grounded_prompt(args.checkpoint, args.words)
    logs = args.out.parent / "speculative-serve"
    logs.mkdir(parents=True, exist_ok=True)
    ours = {"max-gpt2 serve": (), "max-gpt2 serve --prompt-lookup": ("--prompt-lookup", str(args.k))}
    servers, urls = {}, {}
    for name, options in ours.items():
        port = free_port()
        while port in (server.port for server in servers.values()):
            port = free_port()
        log = logs / f"{name.replace(' ', '_')}.log"
        format_options = ("--weight-format", args.weight_format)
        servers[name] = ServerProcess(
            args.checkpoint, log, port, "--device", "cpu", *format_options, *options
        )
        urls[name] = servers[name].url
    llama: dict[str, subprocess.Popen] = {}
    if args.llama_cpp and args.gguf:
        drafting = ("--spec-type", "ngram-simple", "--spec-draft-n-max", str(args.k))
        for name, options in {"llama-server": (), "llama-server ngram-simple": drafting}.items():
            port = free_port()
            command = [
                str(args.llama_cpp / "bin" / "llama-server"), "-m", str(args.gguf), "--port", str(port),
                "-t", "2", "-tb", "2", "-np", str(args.clients), "-c", str(args.clients * args.context),
                "--no-cache-prompt", *options,
            ]  # fmt: skip
            with (logs / f"{name.replace(' ', '_')}.log").open("w") as output:
                llama[name] = subprocess.Popen(
                    command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
                )
            urls[name] = f"http://127.0.0.1:{port}"
    try:
        for server in servers.values():
            server.wait_until_ready(timeout=1800)
        for name, process in llama.items():
            wait_for_health(urls[name], process, timeout=300)
        texts = {name: completion_text(url, text, args.new_tokens) for name, url in urls.items()}
        for name in urls:
            plain = "max-gpt2 serve" if name.startswith("max-gpt2") else "llama-server"
            assert texts[name] == texts[plain], f"{name} wrote other text than {plain}"
        rates: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(args.rounds):
            for name, url in urls.items():
                with ThreadPoolExecutor(args.clients) as pool:
                    urls_now = [url] * args.clients
                    runs = list(
                        pool.map(
                            streamed_request,
                            urls_now,
                            ["gpt2"] * args.clients,
                            [text] * args.clients,
                            [args.new_tokens] * args.clients,
                        )
                    )
                decoding = [(args.new_tokens - 1) / (run["seconds"] - run["arrivals"][0]) for run in runs]
                rates[name].append(float(np.median(decoding)))
        results = {
            name: {
                "tokens/s": float(np.median(rate)),
                "over its plain": float(
                    np.median(
                        np.array(rate)
                        / np.array(rates["max-gpt2 serve" if "max" in name else "llama-server"])
                    )
                ),
            }
            for name, rate in rates.items()
        }
        results["prompt"] = text
        lines = servers["max-gpt2 serve --prompt-lookup"].log.read_text().splitlines()
        results["max-gpt2 serve --prompt-lookup"]["drafts"] = [
            line for line in lines if "prompt lookup:" in line
        ][-1:]
    finally:
        for server in servers.values():
            server.stop()
        for process in llama.values():
            stop_group(process.pid, process.wait)
    for name, figures in results.items():
        print(name, json.dumps(figures), flush=True)
    return results


def completion_text(url: str, prompt: str, new: int) -> str:
    """A greedy completion of `new` tokens (end-of-text ignored) from the server at `url`: its text."""
    body = {"model": "gpt2", "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["text"]


def llama_text(args: argparse.Namespace, tool: list[str], prompt: str, new: int) -> tuple[str, str]:
    """llama.cpp's `tool` (its name, then its own options) on `prompt`, greedy, 2 threads: the text it
    generated (after the prompt) and its log."""
    command = [
        str(args.llama_cpp / "bin" / tool[0]), *tool[1:], "-m", str(args.gguf), "-p", prompt, "-n", str(new),
        "-t", "2", "--temp", "0", "-c", str(args.context),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout.strip().removeprefix(prompt.strip()), done.stdout + done.stderr


def llama_drafting(args: argparse.Namespace, tool: list[str], prompt: str, new: int, plain: str) -> dict:
    """llama.cpp's `llama-lookup` or `llama-speculative` on the same prompt, greedy, 2 threads: its decode
    speed, drafts, and whether its text is `plain`'s (`llama-completion`'s greedy text)."""
    for _ in range(5):  # llama.cpp's logger loses its last lines at exit, now and then
        text, log = llama_text(args, [*tool, "--spec-draft-n-max", str(args.k)], prompt, new)
        if "n_drafted" in log:
            break
    shorter, longer = sorted((text, plain), key=len)
    figures = {"same text": float(longer.startswith(shorter))}
    for key, pattern in (
        ("tokens/s", r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s"),
        ("drafted", r"n_drafted\s*=\s*(\d+)"),
        ("accepted", r"n_accept\s*=\s*(\d+)"),
        ("prompt tokens", r"encoded\s+(\d+) tokens"),
    ):
        found = re.search(pattern, log)
        figures[key] = float(found[1]) if found else float("nan")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["cost", "lookup", "serve"])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument(
        "--weight-format", default=None, help="cost: a comma list; lookup: one (default float32)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--draft", type=Path, help="lookup: a draft model's checkpoint")
    parser.add_argument("--k", type=int, default=8, help="lookup: tokens a draft, at most (default: 8)")
    parser.add_argument("--words", type=int, default=60, help="lookup: the passage's length in words")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--llama-cpp", type=Path, help="lookup: llama.cpp's build directory")
    parser.add_argument("--gguf", type=Path, help="lookup: the checkpoint as a GGUF file, for llama.cpp")
    parser.add_argument("--draft-gguf", type=Path, help="lookup: the draft as a GGUF, for llama-speculative")
    parser.add_argument("--context", type=int, default=128, help="llama.cpp's context (-c), a request's")
    parser.add_argument("--clients", type=int, default=1, help="serve: requests at a time (default: 1)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/speculative.json"))
    args = parser.parse_args()
    if args.what == "cost":
        args.weight_format = args.weight_format or "float32,bfloat16,q8_0,q4_0"
        results = cost(args)
    else:
        args.weight_format = args.weight_format or "float32"
        results = lookup(args) if args.what == "lookup" else serve(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
