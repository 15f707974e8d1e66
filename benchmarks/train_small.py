"""Trains a small GPT-2 here, so that the weight formats' accuracy is measured where it means something.

    python benchmarks/train_small.py                     # ~/.cache/max-gpt2/trained-small, 4 minutes
    python benchmarks/train_small.py --minutes 10 --out DIR
    python benchmarks/train_small.py --copies 0.5 --out TARGET                       # a pair for
    python benchmarks/train_small.py --copies 0.5 --layers 1 --width 96 --heads 2 \
        --tokenizer TARGET --out DRAFT                                               # speculative decoding

Random weights make every next-token distribution nearly flat, which flatters
no format and exaggerates the rest; a trained model has confident, peaked
predictions and a held-out perplexity to lose. The text is what this project
ships (`max_gpt2/data/corpus.txt`) and writes (its Markdown documentation): each
file's last tenth is held out (`held-out.txt` in the output), the rest is trained
on. A byte-level BPE tokenizer is trained on the same text (`write_tokenizer`),
then a 4-layer, 256-wide GPT-2 with 128 positions, with PyTorch and Hugging
Face's `GPT2LMHeadModel` (optional peers: `pip install -e '.[peers]'`), AdamW,
random windows of 128 tokens. The corpus is small (about 20,000 tokens), so the
model soon learns it by heart: held-out loss is measured every 100 steps and the
weights where it was lowest are the ones kept. The result is a Hugging Face
checkpoint (`save_pretrained`, safetensors, with the tokenizer and
`architectures`), which `load_lm` reads like any other.

`--copies F` makes a fraction F of the training windows (and of the held-out ones the weights are
chosen by) a passage followed by the same passage again, so that the model learns to go on
repeating text it has seen earlier in its context (what induction heads do in GPT-2, which learns
it from the web's repetitions; our corpus is too small to teach it): the input-grounded text
prompt lookup speeds up (`benchmarks/speculative.py`).
`--layers`, `--width` and `--heads` change the shapes (a draft model), and `--tokenizer DIR`
takes DIR's tokenizer instead of training one, so that a draft and its target share it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.outputs import default_cache_dir
from max_gpt2.testing import CORPUS, write_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [CORPUS, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
SHAPES = {"n_embd": 256, "n_head": 4, "n_layer": 4, "n_positions": 128}


def split_texts(files: list[Path]) -> tuple[str, str]:
    """(training text, held-out text): each file's last tenth, cut at a line, is held out."""
    train, held_out = [], []
    for file in files:
        lines = file.read_text(encoding="utf-8").splitlines(keepends=True)
        cut = len(lines) * 9 // 10
        train.append("".join(lines[:cut]))
        held_out.append("".join(lines[cut:]))
    return "\n".join(train), "\n".join(held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=default_cache_dir() / "trained-small")
    parser.add_argument("--minutes", type=float, default=4.0, help="training time (default: 4)")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copies", type=float, default=0.0, help="windows that repeat a passage (0-1)")
    parser.add_argument("--layers", type=int, default=SHAPES["n_layer"])
    parser.add_argument("--width", type=int, default=SHAPES["n_embd"])
    parser.add_argument("--heads", type=int, default=SHAPES["n_head"])
    parser.add_argument("--tokenizer", type=Path, help="a directory whose tokenizer.json to use")
    args = parser.parse_args()
    shapes = {**SHAPES, "n_layer": args.layers, "n_embd": args.width, "n_head": args.heads}
    import torch
    import transformers

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    train_text, held_out_text = split_texts(TEXTS)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tokenizer is not None:
        for name in ("tokenizer.json", "vocab.json", "merges.txt"):
            shutil.copyfile(args.tokenizer / name, args.out / name)
        tokenizer = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    else:
        tokenizer = write_tokenizer(args.out, args.vocab_size, train_text.splitlines(keepends=True))
    train = torch.tensor(tokenizer.encode(train_text).ids)
    held_out = torch.tensor(tokenizer.encode(held_out_text).ids)
    vocabulary = tokenizer.get_vocab_size()
    print(f"{train.numel()} training tokens, {held_out.numel()} held out, vocabulary {vocabulary}")

    config = transformers.GPT2Config(
        vocab_size=tokenizer.get_vocab_size(), bos_token_id=0, eos_token_id=0, **shapes
    )
    model = transformers.GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    window, batch = SHAPES["n_positions"], 16

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            pieces = held_out[: held_out.numel() // window * window].view(-1, window).clone()
            copied = round(len(pieces) * args.copies)  # held out as trained: some repeat a passage
            pieces[:copied, window // 2 : 2 * (window // 2)] = pieces[:copied, : window // 2]
            loss = model(pieces, labels=pieces).loss.item()
        model.train()
        return loss

    start, step, deadline = time.monotonic(), 0, time.monotonic() + 60 * args.minutes
    best_loss, best_step, best_state = math.inf, 0, copy.deepcopy(model.state_dict())
    while time.monotonic() < deadline:
        starts = rng.integers(0, train.numel() - window, batch)
        inputs = torch.stack([train[s : s + window] for s in starts])
        for row in np.flatnonzero(rng.random(batch) < args.copies):  # a passage, then the passage again
            half = inputs[row, : window // 2].clone()
            inputs[row, window // 2 : 2 * (window // 2)] = half
        loss = model(inputs, labels=inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 100 == 0:
            held = held_out_loss()
            if held < best_loss:
                best_loss, best_step, best_state = held, step, copy.deepcopy(model.state_dict())
            print(
                f"step {step} ({time.monotonic() - start:.0f} s): train loss {loss.item():.3f}, "
                f"held-out loss {held:.3f} (perplexity {math.exp(held):.1f})",
                flush=True,
            )
    model.load_state_dict(best_state)
    model.eval()
    model.save_pretrained(args.out)  # model.safetensors and config.json, with architectures
    (args.out / "held-out.txt").write_text(held_out_text, encoding="utf-8")
    config_file = args.out / "config.json"
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "n_ctx": SHAPES["n_positions"]}, indent=2)
    )
    print(
        f"held-out perplexity {math.exp(held_out_loss()):.2f} at step {best_step} of {step}, "
        f"the lowest; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
