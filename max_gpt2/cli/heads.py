"""`max-gpt2 heads`: what every attention head looks at, as a heatmap gallery and a summary table.

    max-gpt2 heads --checkpoint ~/models/gpt2 --prompt "The cat sat on the mat" --out heads.png
    max-gpt2 heads --checkpoint DIR --tokens 464,3290,3332 --layers 0,5,11 --json
    max-gpt2 heads --checkpoint ~/models/gpt2 --prompt-file story.txt --html story.html

Runs the prompt through the language model's attention-weights graph
(`CompiledLM.attentions`), draws a heatmap per head of the chosen layers
(`max_gpt2.analysis.gallery`; one PNG per layer when there are more than 48 heads) and
prints a line per head with its averages and nearest kind (`max_gpt2.analysis.head_summary`),
or the same as JSON with `--json`. With `--html` it writes the head explorer
(`max_gpt2.explorer`, `max-gpt2 explore`'s page) for the prompt as one self-contained file,
every layer's maps inside it and nothing fetched from elsewhere, instead of the PNGs.
Without `--checkpoint` it uses the seeded demo checkpoint, whose random weights make
heads without a purpose; a real GPT-2 shows previous-token, first-token and broad heads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from max_gpt2.analysis.gallery import draw_gallery, require_matplotlib
from max_gpt2.analysis.head_summary import format_summary, summarize
from max_gpt2.cli.console import add_prompt_arguments, open_prompt, parse_layers
from max_gpt2.explorer.data import explore
from max_gpt2.explorer.page import page
from max_gpt2.inference.loading import load_lm
from max_gpt2.inference.prompts import check_prompt
from max_gpt2.outputs import Progress, write_atomically

HTML_MAX = 64_000_000  # bytes a standalone page may hold: its maps grow with heads x tokens squared


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own options (`--device` and `--dtype` come from the CLI's shared parent)."""
    add_prompt_arguments(parser, "to look at")
    parser.add_argument("--layers", default="all", help="'all' or a list such as '0,5,11' (default: all)")
    parser.add_argument("--out", type=Path, default=Path("heads.png"), help="the PNG (default: heads.png)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--html", type=Path, help="write the head explorer for the prompt to this one file, not PNGs"
    )


def main(args: argparse.Namespace, progress: Progress) -> int:
    """Checks everything, compiles the attention-weights graph, then draws and summarizes."""
    checkpoint, tokenizer, prompt = open_prompt(args, progress)
    config = checkpoint.config
    ids, _ = check_prompt(config, np.array([prompt], dtype=np.int64))
    if len(prompt) < 2:
        raise ValueError(
            f"the prompt has {len(prompt)} token; telling kinds of heads apart needs at least two tokens"
        )
    layers = parse_layers(args.layers, config.n_layer)
    if args.html is not None:
        check_html(args.html, len(prompt), config.n_layer * config.n_head)
    else:
        require_matplotlib()  # before minutes of compiling
        if not args.out.parent.is_dir():
            raise ValueError(f"--out {args.out}: the directory {args.out.parent} does not exist")

    lm = load_lm(
        checkpoint.path,
        args.device,
        args.dtype,
        output_attentions=True,
        progress=progress,
        cache_dir=args.cache_dir,
    )
    if args.html is not None:
        exploration = explore(lm, ids[0], tokenizer)  # every position's logits too, for the page
        html = page(data=exploration.summary(with_maps=True))
        write_atomically(args.html, lambda partial: partial.write_text(html, encoding="utf-8"))
        progress.note(f"wrote {args.html} ({len(html) / 1e6:.1f} MB): open it in a browser")
        print(format_summary(summarize(exploration.attentions[layers][:, None], layers=layers)))
        return 0
    attentions = lm.attentions(ids)[layers, 0]  # [layers, heads, seq, seq]
    summaries = summarize(attentions[:, None], layers=layers)

    if tokenizer is not None:
        tokens = [tokenizer.decode([token]) for token in prompt]
    else:
        tokens = [str(token) for token in prompt]
    with progress.step(f"drawing {len(layers) * config.n_head} heads"):
        paths = draw_gallery(attentions, layers, [repr(token)[1:-1] for token in tokens], summaries, args.out)
    for path in paths:
        progress.note(f"wrote {path}")
    if args.json:
        report = {"checkpoint": str(checkpoint.path), "tokens": tokens, "images": [str(p) for p in paths]}
        print(json.dumps({**report, "heads": [row.to_dict() for row in summaries]}, indent=2))
    else:
        print(format_summary(summaries))
    return 0


def check_html(path: Path, tokens: int, heads: int) -> None:
    """Refuses, before compiling, a page that would pass `HTML_MAX` or has no directory to go in."""
    if not path.parent.is_dir():
        raise ValueError(f"--html {path}: the directory {path.parent} does not exist")
    size = heads * tokens * tokens * 4 // 3  # the maps, one byte a weight, in base64
    if size > HTML_MAX:
        most = int((HTML_MAX * 3 / 4 / heads) ** 0.5)
        raise ValueError(
            f"--html: {tokens} tokens x {heads} heads make {size / 1e6:.0f} MB of maps; a standalone page "
            f"holds at most {HTML_MAX / 1e6:.0f} MB, {most} tokens for this model (max-gpt2 explore has "
            f"no such limit)"
        )
