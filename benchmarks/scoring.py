"""Scoring speed: `lm.logprobs` beside `lm.prefill`, and `max-gpt2 perplexity` beside llama-perplexity.

    python benchmarks/scoring.py --checkpoint DIR                       # in-process, every format
    python benchmarks/scoring.py --checkpoint DIR --text FILE --chunks-only \\
        --llama-perplexity BUILD/bin/llama-perplexity --gguf float32=f32.gguf,q4_0=q4_0.gguf

In-process, per weight format, in interleaved rounds: one row of `--tokens` tokens
(at most `n_positions`) through `lm.prefill` (logits of the last position only) and
through `lm.logprobs` (the log-probability of every token, reduced in the graph),
each rate in tokens/s and their ratio within a round; the median round is reported.

Whole process, per format given a GGUF of the same weights: `max-gpt2 perplexity
--chunks` on `--text` against `llama-perplexity -c n_positions` (the same windows:
side by side, each scoring its second half), in turn for `--rounds` rounds: the
tokens run through the model per second (ours from its JSON; llama.cpp's over the
seconds its log stamps from the first chunk to the estimate, and its prompt
evaluation's alone, which leaves out its log-softmax) and each process's peak RSS
(`wait4`).

With `--echo`, the server's scoring path (lm-evaluation-harness's: `echo` with
`logprobs`): `max-gpt2 serve` in the first format, one `--tokens` prompt sent with
`echo=true, logprobs=1, max_tokens=1` and without (the prompt's last logits only),
in turn, tokens/s of each; and MAX's log-probability op alone (the server's,
`compute_log_probabilities_ragged`) on that prompt's `[tokens, vocab]` logits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from max.driver import CPU, Buffer

from max_gpt2 import load_lm
from max_gpt2.bench.harness import machine_description
from max_gpt2.bench.llama_cpp import check_binary, parse_gguf
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.model.formats import FORMATS, WeightFormat, format_named

LLAMA_RATE = re.compile(r"prompt eval time =.*?([0-9.]+) tokens per second")
LLAMA_START = re.compile(
    r"(?P<at>[0-9.]+) I perplexity: calculating .* over (?P<chunks>\d+) chunks, n_ctx=(?P<n_ctx>\d+)"
)
LLAMA_FINAL = re.compile(r"(?P<at>[0-9.]+) I Final estimate: PPL = (?P<ppl>[0-9.]+)")


def in_process(checkpoint: Path, weight_format: WeightFormat, tokens: int, rounds: int) -> dict[str, float]:
    """Median tokens/s of `prefill` and `logprobs` on one row of `tokens` ids, and their ratio."""
    lm = load_lm(checkpoint, "cpu", weight_format=weight_format)
    tokens = min(tokens, lm.config.n_positions)
    ids = np.random.default_rng(0).integers(0, lm.config.vocab_size, (1, tokens))
    lm.prefill(ids, lm.new_cache(1, tokens)), lm.logprobs(ids)  # compiled and warm
    prefill, scoring = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        lm.prefill(ids, lm.new_cache(1, tokens))
        prefill.append(tokens / (time.perf_counter() - started))
        started = time.perf_counter()
        lm.logprobs(ids)
        scoring.append(tokens / (time.perf_counter() - started))
    ratios = [s / p for s, p in zip(scoring, prefill, strict=True)]
    return {
        "tokens": tokens,
        "prefill_tok_s": statistics.median(prefill),
        "logprobs_tok_s": statistics.median(scoring),
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
    }


def run_measured(command: list[str]) -> tuple[str, int]:
    """`command`'s output (stdout and stderr) and its peak RSS in MB; a RuntimeError if it fails."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        output = child.stdout.read() if child.stdout else ""
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}):\n{output[-2000:]}")
    return output, usage.ru_maxrss // 1024


def ours(checkpoint: Path, weight_format: WeightFormat, text: Path, threads: int) -> dict[str, float]:
    command = [sys.executable, "-m", "max_gpt2", "perplexity", "--checkpoint", str(checkpoint)]
    command += ["--device", "cpu", "--weight-format", weight_format.name, "--chunks", "--json", str(text)]
    output, rss = run_measured(command)
    (result,) = json.loads(output[output.index("{") :])["files"].values()
    return {"tok_s": result["tokens_run"] / result["seconds"], "rss_mb": rss, "ppl": result["perplexity"]}


def llama(binary: Path, gguf: Path, text: Path, context: int, threads: int) -> dict[str, float]:
    """llama-perplexity's rates: the whole perplexity's (tokens run over the seconds from its first
    chunk to its estimate, by its log's timestamps) and its prompt evaluation's alone (`-v` prints
    it), which leaves out the log-softmax it takes on the host."""
    command = [str(binary), "-m", str(gguf), "-f", str(text), "-c", str(context), "-t", str(threads), "-v"]
    output, rss = run_measured(command)
    rate, start, final = LLAMA_RATE.search(output), LLAMA_START.search(output), LLAMA_FINAL.search(output)
    if rate is None or start is None or final is None:
        raise RuntimeError(f"no rate, chunks or estimate in llama-perplexity's output:\n{output[-2000:]}")
    tokens = int(start.group("chunks")) * int(start.group("n_ctx"))
    seconds = log_seconds(final.group("at")) - log_seconds(start.group("at"))
    return {
        "tok_s": tokens / seconds,
        "eval_tok_s": float(rate.group(1)),
        "rss_mb": rss,
        "ppl": float(final.group("ppl")),
    }


def log_seconds(stamp: str) -> float:
    """Seconds from a llama.cpp log line's timestamp, minutes.seconds.milliseconds.microseconds."""
    minutes, seconds, milli, micro = (int(part) for part in stamp.split("."))
    return minutes * 60 + seconds + milli / 1e3 + micro / 1e6


def max_logprob_op(tokens: int, vocab: int, rounds: int) -> float:
    """Median seconds of MAX's log-probability op, as the server runs it for one echoed request of
    `tokens` tokens: logits float32 [tokens, vocab] in, each token's log-probability and top 1 out."""
    from max.engine import InferenceSession
    from max.graph import DeviceRef
    from max.pipelines.lib.log_probabilities import (
        compute_log_probabilities_ragged,
        log_probabilities_ragged_graph,
    )

    model = InferenceSession(devices=[CPU()]).load(log_probabilities_ragged_graph(DeviceRef.CPU(), levels=3))
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((tokens, vocab), dtype=np.float32)
    rows, last = Buffer.from_numpy(logits), Buffer.from_numpy(np.ascontiguousarray(logits[-1:]))
    times = []
    for _ in range(rounds + 1):  # the first warms up
        started = time.perf_counter()
        compute_log_probabilities_ragged(
            CPU(),
            model,
            input_row_offsets=np.array([0, tokens], dtype=np.uint32),
            logits=rows,
            next_token_logits=last,
            tokens=rng.integers(0, vocab, tokens),
            sampled_tokens=np.zeros(1, dtype=np.int64),
            batch_top_n=[1],
            batch_echo=[True],
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def served_echo(checkpoint: Path, weight_format: WeightFormat, tokens: int, rounds: int) -> dict[str, float]:
    """Median tokens/s of one prompt through `max-gpt2 serve` with echo and log-probabilities, and
    without (the last position's logits only)."""
    config = json.loads((checkpoint / "config.json").read_text())
    tokens = min(tokens, config["n_positions"] - 1)
    ids = np.random.default_rng(0).integers(0, config["vocab_size"], tokens).tolist()
    with tempfile.TemporaryDirectory() as scratch:
        server = ServerProcess(
            checkpoint, Path(scratch) / "serve.log", free_port(), "--weight-format", weight_format.name
        )
        try:
            server.wait_until_ready(1800)
            with urllib.request.urlopen(f"{server.url}/v1/models") as response:
                model = json.load(response)["data"][0]["id"]

            def rate(**options: object) -> float:
                body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, **options}
                request = urllib.request.Request(
                    f"{server.url}/v1/completions",
                    json.dumps(body).encode(),
                    {"Content-Type": "application/json"},
                )
                started = time.perf_counter()
                with urllib.request.urlopen(request, timeout=600) as response:
                    json.load(response)
                return tokens / (time.perf_counter() - started)

            rate(echo=True, logprobs=1), rate()  # warm
            echoed, plain = [], []
            for _ in range(rounds):
                echoed.append(rate(echo=True, logprobs=1))
                plain.append(rate())
        finally:
            server.stop()
    return {
        "tokens": tokens,
        "echo_tok_s": statistics.median(echoed),
        "prompt_tok_s": statistics.median(plain),
        "max_logprob_op_s": max_logprob_op(tokens, config["vocab_size"], rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="our checkpoint directory")
    parser.add_argument("--weight-format", default=",".join(FORMATS), help="comma-separated formats")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens a row in-process (default 1024)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--text", type=Path, help="a UTF-8 file for the whole-process comparison")
    parser.add_argument("--chunks-only", action="store_true", help="skip the in-process comparison")
    parser.add_argument("--llama-perplexity", help="llama.cpp's llama-perplexity binary")
    parser.add_argument("--gguf", help="FORMAT=FILE,... the same weights as GGUF, per format")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--echo", action="store_true", help="the server's echo path too (serving extra)")
    args = parser.parse_args()
    formats = [format_named(name.strip(), "--weight-format") for name in args.weight_format.split(",")]
    report: dict = {"machine": machine_description(CPU()), "in_process": {}, "whole_process": {}}
    if not args.chunks_only:
        for weight_format in formats:
            result = in_process(args.checkpoint, weight_format, args.tokens, args.rounds)
            report["in_process"][weight_format.name] = result
            print(
                f"{weight_format.name:>9}: prefill {result['prefill_tok_s']:7.1f} tok/s, logprobs "
                f"{result['logprobs_tok_s']:7.1f} tok/s, {result['ratio']:.2f} of prefill "
                f"({result['ratio_range'][0]:.2f}-{result['ratio_range'][1]:.2f})",
                flush=True,
            )
    if args.llama_perplexity and args.gguf and args.text:
        binary, files = check_binary(args.llama_perplexity), parse_gguf(args.gguf)
        context = json.loads((args.checkpoint / "config.json").read_text())["n_positions"]
        for weight_format, gguf in files.items():
            rounds = []
            for _ in range(args.rounds):  # in turn, so the machine's drift hits both alike
                rounds.append(
                    (
                        ours(args.checkpoint, weight_format, args.text, args.threads),
                        llama(binary, gguf, args.text, context, args.threads),
                    )
                )
            ratios = [a["tok_s"] / b["tok_s"] for a, b in rounds]
            summary = {
                "ours_tok_s": statistics.median(a["tok_s"] for a, _ in rounds),
                "llama_tok_s": statistics.median(b["tok_s"] for _, b in rounds),
                "llama_eval_tok_s": statistics.median(b["eval_tok_s"] for _, b in rounds),
                "ratio": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
                "ours_rss_mb": max(a["rss_mb"] for a, _ in rounds),
                "llama_rss_mb": max(b["rss_mb"] for _, b in rounds),
                "ours_ppl": rounds[0][0]["ppl"],
                "llama_ppl": rounds[0][1]["ppl"],
            }
            report["whole_process"][weight_format.name] = summary
            print(
                f"{weight_format.name:>9}: ours {summary['ours_tok_s']:.1f} tok/s run, llama-perplexity "
                f"{summary['llama_tok_s']:.1f} (its prompt evaluation alone "
                f"{summary['llama_eval_tok_s']:.1f}): {summary['ratio']:.2f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f}); "
                f"peak RSS {summary['ours_rss_mb']} MB against {summary['llama_rss_mb']}; "
                f"PPL {summary['ours_ppl']:.4f} against {summary['llama_ppl']:.4f}",
                flush=True,
            )
    if args.echo:
        report["echo"] = echo = served_echo(args.checkpoint, formats[0], args.tokens, args.rounds)
        print(
            f"server, {formats[0]}, {echo['tokens']} tokens: echo with logprobs "
            f"{echo['echo_tok_s']:.1f} tok/s, "
            f"the prompt alone {echo['prompt_tok_s']:.1f} tok/s; MAX's log-probability op "
            f"{echo['max_logprob_op_s'] * 1000:.0f} ms of it",
            flush=True,
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
