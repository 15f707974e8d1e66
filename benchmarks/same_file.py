"""Ours beside llama.cpp on the very same GGUF files: batch-1 decoding and a prompt, interleaved.

    python benchmarks/same_file.py --llama-bench BUILD/bin/llama-bench q4_k_m.gguf q6_k.gguf ...
    python benchmarks/same_file.py --llama-bench ... --rounds 5 --prompt 512 --new 128 --json out.json

Each file is loaded as it is (`load_lm(file)`: its own types, a llama-quantize mix tensor by
tensor, or float32 where no kernel reads them) and timed in rounds, each round running
`llama-bench -p PROMPT -n NEW -t THREADS -r 1` on the file and then ours: a PROMPT-token prefill,
and NEW tokens decoded one at a time after a 32-token prompt (`lm.stream`, greedy). The medians
of the rounds and their ratios are printed as a Markdown table with the CPU they ran on. Files
come from `llama-quantize F32.gguf OUT.gguf PRESET` (`max-gpt2 convert` writes the F32 file, or
the same presets: `--weight-format q4_k_m`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np
from max.driver import CPU

from max_gpt2 import CompiledLM, load_lm
from max_gpt2.bench.harness import machine_description
from max_gpt2.bench.llama_cpp import check_binary


def llama_rates(binary: Path, gguf: Path, prompt: int, new: int, threads: int) -> tuple[float, float]:
    """llama-bench's tokens/s on `gguf`: a PROMPT-token prompt, then NEW tokens generated."""
    command = [str(binary), "-m", str(gguf), "-p", str(prompt), "-n", str(new), "-t", str(threads)]
    done = subprocess.run([*command, "-r", "1", "-o", "json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
    rates = {bool(row["n_prompt"]): row["avg_ts"] for row in json.loads(done.stdout)}
    return rates[True], rates[False]


def our_rates(lm: CompiledLM, prompt: int, new: int, rng: np.random.Generator) -> tuple[float, float]:
    """Our tokens/s: a PROMPT-token prefill, then NEW tokens decoded after a 32-token prompt."""
    ids = rng.integers(0, lm.config.vocab_size, (1, prompt))
    cache = lm.new_cache(1, prompt)
    start = time.perf_counter()
    lm.prefill(ids, cache)
    prefill = prompt / (time.perf_counter() - start)
    times = [time.perf_counter() for _ in lm.stream(ids[:, :32], new + 1)]
    return prefill, new / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path, help="GGUF files of GPT-2")
    parser.add_argument("--llama-bench", required=True, help="a llama.cpp build's llama-bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens (default: 512)")
    parser.add_argument("--new", type=int, default=128, help="tokens decoded (default: 128)")
    parser.add_argument("--threads", type=int, default=2, help="llama-bench's threads (default: 2)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    binary = check_binary(args.llama_bench)
    rng = np.random.default_rng(0)
    rows = []
    for file in args.files:
        lm = load_lm(file, "cpu")
        ours, theirs = [], []
        for _ in range(args.rounds):
            theirs.append(llama_rates(binary, file, args.prompt, args.new, args.threads))
            ours.append(our_rates(lm, args.prompt, args.new, rng))
        (our_prompt, our_decode), (their_prompt, their_decode) = np.median(ours, 0), np.median(theirs, 0)
        rows.append(
            {
                "file": file.name,
                "loads as": lm.weight_format.name,
                "decode": [our_decode, their_decode],
                f"prompt {args.prompt}": [our_prompt, their_prompt],
            }
        )
    machine = machine_description(CPU())
    print(
        f"{machine['cpu']}, {machine['cores']} cores; medians of {args.rounds} interleaved rounds, tokens/s\n"
    )
    decode, prompt = f"llama tg{args.new}", f"llama pp{args.prompt}"
    print(f"| file | loads as | decode ours | {decode} | ratio | prompt ours | {prompt} | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        (our_decode, their_decode), (our_prompt, their_prompt) = row["decode"], row[f"prompt {args.prompt}"]
        print(
            f"| {row['file']} | {row['loads as']} | {our_decode:.1f} | {their_decode:.1f} | "
            f"{our_decode / their_decode:.2f}x | {our_prompt:.0f} | {their_prompt:.0f} | "
            f"{our_prompt / their_prompt:.2f}x |"
        )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
