"""`max-gpt2 score`: each token of a text with its log-probability, and the likeliest alternatives.

    max-gpt2 score --checkpoint ~/models/gpt2 --prompt "The cat sat on the mat" --top 3
    max-gpt2 score --checkpoint DIR --tokens 464,3797,3332 --json

A token's log-probability is that of the model choosing it after the tokens
before it (`CompiledLM.score`); the first token has none. The table goes to
stdout (`--json`: the same as JSON, each token's text as it is, null without a tokenizer, and
the first token's values null). A NaN log-probability past the first (weights that are not finite)
shows as `nan` (null in JSON), with a warning.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from typing import Any

import numpy as np

from max_gpt2.cli.console import add_prompt_arguments, add_storage_arguments, open_prompt, storage_options
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.prompts import check_prompt
from max_gpt2.inference.scoring import RANKED
from max_gpt2.outputs import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    add_prompt_arguments(parser, "to score")
    add_storage_arguments(parser)
    parser.add_argument(
        "--top", type=int, default=0, help=f"also show the N (at most {RANKED}) likeliest tokens at each"
    )
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks the prompt, compiles, then prints every token's log-probability."""
    checkpoint, tokenizer, prompt = open_prompt(args, progress)
    ids, _ = check_prompt(checkpoint.config, np.array([prompt], dtype=np.int64))
    if not 0 <= args.top <= RANKED:
        raise ValueError(f"--top must be in 0..{RANKED}, got {args.top}")
    lm = load_lm(checkpoint, args.device, args.dtype, progress=progress, **storage_options(args))
    scores = lm.score(ids, top_k=args.top)

    def text(token: int) -> str | None:  # None: no tokenizer to spell it
        return tokenizer.decode([token]) if tokenizer is not None else None

    if not_finite := int(np.isnan(scores.logprobs[0, 1:]).sum()):
        warnings.warn(
            f"the model's log-probabilities are NaN at {not_finite} of {len(prompt) - 1} positions: its "
            f"outputs are not finite (check {checkpoint.path}'s weights)",
            stacklevel=1,
        )
    rows = []
    for position, token in enumerate(prompt):
        logprob = float(scores.logprobs[0, position])
        top = [
            {"id": int(alternative), "token": text(int(alternative)), "logprob": float(value)}
            for alternative, value in zip(
                scores.top_ids[0, position], scores.top_logprobs[0, position], strict=True
            )
            if alternative >= 0
        ]
        rows.append(
            {
                "id": token,
                "token": text(token),
                "logprob": None if math.isnan(logprob) else logprob,
                "top": top,
            }
        )
    if args.json:
        print(json.dumps({"checkpoint": str(checkpoint.path), "tokens": rows}, indent=2))
        return 0
    print(
        f"{'position':>8}  {'id':>6}  {'token':<20}  {'logprob':>9}"
        + ("  likeliest instead" if args.top else "")
    )
    for position, row in enumerate(rows):
        logprob = ("nan" if position else "-") if row["logprob"] is None else f"{row['logprob']:.4f}"
        others = ", ".join(f"{shown(choice)} {choice['logprob']:.2f}" for choice in row["top"])
        print(f"{position:>8}  {row['id']:>6}  {shown(row):<20}  {logprob:>9}  {others}".rstrip())
    return 0


def shown(row: dict[str, Any]) -> str:
    """A token as the table shows it: its text quoted (spaces seen), or its id without a tokenizer."""
    return str(row["id"]) if row["token"] is None else repr(row["token"])
