"""Example 4: generate text with the whole GPT-2 on MAX, and check the KV cache against recomputation.

With a path (a GPT-2 checkpoint directory with its tokenizer, or a Hub id) it
uses that checkpoint; without one it writes a small seeded GPT-2 (three layers,
random weights, a tokenizer trained on the text we ship) to a temporary folder.
Random weights make gibberish; a real checkpoint makes English.

    python examples/04_generate.py [CHECKPOINT] [PROMPT]
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from max_gpt2 import GPT2Config, load_lm
from max_gpt2.inference.tokenizer import TextStream, load_tokenizer
from max_gpt2.testing import write_checkpoint
from max_gpt2.verify import compare, precision

SMALL_SEEDED = GPT2Config(n_embd=60, n_head=5, n_layer=3, n_positions=48, vocab_size=320)

with tempfile.TemporaryDirectory() as scratch:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        path = write_checkpoint(scratch, SMALL_SEEDED, seed=0, tokenizer=True)
        print(f"wrote a seeded three-layer GPT-2 with a tokenizer to {path}")
    prompt = sys.argv[2] if len(sys.argv) > 2 else "The cat sat by the window"

    start = time.perf_counter()
    lm = load_lm(path, device="auto")  # read the checkpoint, compile the model, bind the weights
    print(f"{lm} ready in {time.perf_counter() - start:.1f} s")
    tokenizer = load_tokenizer(path)

    # Streaming: each step reads the KV cache and adds one token per row.
    ids = np.array([tokenizer.encode(prompt).ids])
    text = TextStream(tokenizer)
    print("".join(text(token) for token in ids[0]), end="", flush=True)
    steps = list(lm.stream(ids, max_new_tokens=20))
    for step in steps:
        print(text(step.tokens[0]), end="", flush=True)
    print(text.flush())

    # The cache changes nothing: every step's logits equal a full forward over the same tokens.
    generated = np.concatenate([ids, [[int(step.tokens[0]) for step in steps]]], axis=1)
    recomputed = lm.logits(generated)[0, ids.shape[1] - 1 : -1]  # [steps, vocab]
    cached = np.stack([step.logits[0] for step in steps])
    # On a GPU, MAX multiplies float32 matrices in TF32 (`max_gpt2.verify`).
    comparison = compare(cached, recomputed.astype(np.float64), precision("float32", not lm.device.is_host))
    print(f"cached decoding vs full recomputation: max |difference| {comparison.max_abs_error:.1e}")
    print(f"agrees: {comparison.passed}")
    passed = comparison.passed

    # A batch of prompts of different lengths, left-padded as Hugging Face pads them.
    prompts = [tokenizer.encode(words).ids for words in ("The dog", "On Thursday the wind")]
    width = max(map(len, prompts))
    batch = np.array([[0] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = lm.generate(batch, max_new_tokens=8, attention_mask=mask)
    for row, tokens in enumerate(prompts):
        alone = lm.generate(np.array([tokens]), max_new_tokens=8)[0]
        same = np.array_equal(alone, out[row, width - len(tokens) :])
        print(f"{tokenizer.decode(alone.tolist())!r}: same in the padded batch: {same}")
        passed &= same

raise SystemExit(0 if passed else 1)
