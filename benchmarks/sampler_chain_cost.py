"""What llama-server's sampler chain costs a token on the host (`max_gpt2.inference.sampler_chain`), per
setting, over rows of GPT-2's 50,257 logits.

    python benchmarks/sampler_chain_cost.py [--rows 20] [--rounds 5] [--vocab DIR/vocab.json]

The rows are standard normal logits times 2, a flat distribution: the cuts that sort what they keep
(top-p, typical-p, Mirostat's candidates) keep many tokens from it, so these are the slow side.
DRY reads a history of 1,024 ids that repeats itself (a 64-token passage over and over, the search's
slow side), its breakers llama-server's, found in GPT-2's vocabulary once beforehand (`--vocab`, a
`vocab.json`; without it DRY runs with no breakers). Each case runs over every row, `--rounds` times;
the milliseconds a row are printed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from max.driver import CPU

from max_gpt2.bench.harness import machine_description
from max_gpt2.inference.dry import breaker_heads
from max_gpt2.inference.sampler_chain import chain
from max_gpt2.inference.token_pickers import adaptive_p, mirostat_v1, mirostat_v2
from max_gpt2.inference.tokenizer import load_tokenizer, token_bytes

DEFAULTS = [("top_k", 40), ("top_p", 0.95), ("min_p", 0.05)]  # llama-server's
CASES = {
    "llama-server's defaults, temperature 0.8": [*DEFAULTS, ("temperature", 0.8)],
    "with top-n-sigma 1 and typical-p 0.9": [
        ("top_n_sigma", 1.0), ("top_k", 40), ("typ_p", 0.9), *DEFAULTS[1:], ("temperature", 0.8)
    ],
    "with XTC drawn (threshold 0.01)": [*DEFAULTS, ("xtc", 1.0, 0.01), ("temperature", 0.8)],
    "typical-p 0.9 alone, no top-k": [("typ_p", 0.9), ("temperature", 0.8)],
    "with a dynamic temperature (0.8 +- 0.5)": [*DEFAULTS, ("temperature", 0.8, 0.5, 1.0)],
    "with DRY (0.8, 1.75, 2, window 1024)": [("dry", 0.8, 1.75, 2, 1024), *DEFAULTS, ("temperature", 0.8)],
}  # fmt: skip
BREAKERS = ("\n", ":", '"', "*")  # llama-server's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", help="GPT-2's vocab.json (with merges.txt beside it), for DRY's breakers")
    args = parser.parse_args()
    generator = np.random.default_rng(0)
    rows = [(generator.standard_normal(50257) * 2).astype(np.float32) for _ in range(args.rows)]
    history = np.tile(generator.integers(0, 50257, 64), 16)  # 1,024 ids
    heads = {}
    print(machine_description(CPU()))
    if args.vocab:
        tokenizer = load_tokenizer(Path(args.vocab).parent)
        assert tokenizer is not None, f"no tokenizer beside {args.vocab}"
        started = time.perf_counter()
        pieces = [token_bytes(tokenizer, token) for token in range(tokenizer.get_vocab_size())]
        heads = breaker_heads(
            BREAKERS, pieces, lambda text: tokenizer.encode(text, add_special_tokens=False).ids
        )
        print(f"DRY's breakers found once: {time.perf_counter() - started:.2f} s, {len(heads)} tokens")
    runs = {
        name: lambda row, steps=steps: chain(row, steps, 0.0, history, heads) for name, steps in CASES.items()
    }
    for version, pick in ((1, mirostat_v1), (2, mirostat_v2)):
        runs[f"Mirostat {version} (tau 5, mu 10), temperature 0.8"] = lambda row, pick=pick: pick(
            chain(row, [("temperature", 0.8)]), 5.0, 0.1, 10.0, 0.4
        )
    runs["adaptive-p (target 0.3) after the defaults"] = lambda row: adaptive_p(
        chain(row, [*DEFAULTS, ("temperature", 0.8)]), 0.3, 3.0, 10.0, 0.4
    )
    for name, run in runs.items():
        run(rows[0])  # warm
        started = time.perf_counter()
        for _ in range(args.rounds):
            for row in rows:
                run(row)
        print(f"{name}: {(time.perf_counter() - started) / (args.rounds * len(rows)) * 1e3:.2f} ms a row")


if __name__ == "__main__":
    main()
