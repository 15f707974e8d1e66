"""Greedy generation, ours against Hugging Face's `generate`, side by side (needs torch and transformers).

For each case (batch x prompt length + new tokens) both generate from the same
random prompt; their tokens must agree before anything is timed. Then rounds
alternate between the two, and the table gives medians: prefill (the prompt's
forward, to the first token) and decode tokens/s (every later token, over the batch).

    python benchmarks/generation.py                       # GPT-2-small-shaped seeded checkpoint
    python benchmarks/generation.py --checkpoint ~/models/gpt2 --cases 1x32+128,8x32+128 --rounds 5

This is a first measurement, not yet the project's generation benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from max_gpt2 import load_lm
from max_gpt2.console import Progress, default_cache_dir, demo_checkpoint
from max_gpt2.measure import settle


def ours(lm, ids: np.ndarray, new: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s) of one greedy generation."""
    start, times = time.perf_counter(), []
    for _ in lm.stream(ids, new):
        times.append(time.perf_counter())
    return times[0] - start, ids.shape[0] * (len(times) - 1) / (times[-1] - times[0])


def hugging_face(model, ids: np.ndarray, new: int) -> tuple[float, float]:
    """The same for Hugging Face: prefill is a forward over the prompt, decode what generate adds."""
    tokens = torch.from_numpy(ids)
    start = time.perf_counter()
    model(tokens)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    greedy(model, ids, new)
    total = time.perf_counter() - start
    return prefill, ids.shape[0] * (new - 1) / (total - prefill)


def greedy(model, ids: np.ndarray, new: int) -> np.ndarray:
    """Hugging Face's greedy tokens, int64 [batch, prompt + new], never stopping early."""
    tokens = torch.from_numpy(ids)
    return model.generate(
        tokens, max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None
    ).numpy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="GPT-2 checkpoint (default: the seeded GPT-2-small-shaped one)")
    parser.add_argument("--cases", default="1x32+128,8x32+128,1x896+128", help="BATCHxPROMPT+NEW list")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    progress = Progress(sys.stderr)
    path = Path(args.checkpoint) if args.checkpoint else demo_checkpoint(default_cache_dir(), 0, progress)
    with progress.step("loading and compiling ours"):
        lm = load_lm(path, device="cpu")
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="sdpa").eval()
    rng = np.random.default_rng(0)
    warm = rng.integers(0, lm.config.vocab_size, (1, 8))  # what each runs untimed before its turn
    print("| batch | prompt + new | ours prefill ms | HF prefill ms | ours tok/s | HF tok/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in args.cases.split(","):
        batch, rest = case.split("x")
        prompt, new = (int(part) for part in rest.split("+"))
        ids = rng.integers(0, lm.config.vocab_size, (int(batch), prompt))
        if not np.array_equal(lm.generate(ids, new), greedy(model, ids, new)):
            print(f"{case}: the tokens differ from Hugging Face's; not timed", file=sys.stderr)
            return 1
        timings: dict[str, list[tuple[float, float]]] = {"ours": [], "hf": []}
        for _ in range(args.rounds):
            settle(lm.logits, warm)
            timings["ours"].append(ours(lm, ids, new))
            settle(model, torch.from_numpy(warm))
            timings["hf"].append(hugging_face(model, ids, new))
        (our_prefill, our_rate), (hf_prefill, hf_rate) = (
            tuple(statistics.median(values) for values in zip(*timings[who], strict=True))
            for who in ("ours", "hf")
        )
        print(
            f"| {batch} | {prompt} + {new} | {our_prefill * 1e3:.0f} | {hf_prefill * 1e3:.0f} | "
            f"{our_rate:.1f} | {hf_rate:.1f} | {our_rate / hf_rate:.2f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
