"""What the head explorer shows for one sequence, from one forward pass, and how it travels to the page.

    exploration = explore(lm, ids, tokenizer)      # `CompiledLM.logits_and_attentions`, batch 1
    exploration.summary()                          # JSON: tokens, probabilities, scores, thumbnails
    exploration.head_map(layer, head)              # JSON: one head's full map (head None: the layer's mean)

For a sequence of S tokens: every head's attention weights `[layers, heads, S, S]`; each token's
probability given the tokens before it and the `ALTERNATIVES` likeliest tokens there (and after the
last token); each head's previous-token, duplicate-token and induction scores
(`max_gpt2.analysis.head_scores`). Maps travel as bytes: each weight as round(255 w), uint8,
row-major, base64. The model view gets every head at once as a thumbnail of at most `THUMBNAIL`
x `THUMBNAIL` (each cell the largest weight of the block of the full map it covers), so 1024
tokens x 12 layers x 12 heads send 590 KB; a head's full map comes when it is opened.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.analysis.head_scores import KINDS, HeadScores, head_scores, ranking
from max_gpt2.inference.beam_search import top
from max_gpt2.inference.lm import CompiledLM
from max_gpt2.inference.sampling import softmax
from max_gpt2.inference.tokenizer import token_bytes

ALTERNATIVES = 5
THUMBNAIL = 64


def encoded(weights: np.ndarray) -> str:
    """Weights in [0, 1] as base64 bytes, each round(255 w)."""
    return base64.b64encode(np.rint(np.clip(weights, 0, 1) * 255).astype(np.uint8).tobytes()).decode()


def thumbnails(attentions: np.ndarray, size: int = THUMBNAIL) -> np.ndarray:
    """`[..., S, S]` -> `[..., T, T]`, T = min(S, size): each cell the largest weight of its block."""
    length = attentions.shape[-1]
    if length <= size:
        return attentions
    starts = np.arange(size) * length // size
    rows = np.maximum.reduceat(attentions, starts, axis=-2)
    return np.maximum.reduceat(rows, starts, axis=-1)


def text_of(tokenizer: Tokenizer | None, token: int) -> str:
    """How a token shows on the page: its bytes as text (a byte no character completes, as \\xNN),
    or its id where there is no tokenizer, or in brackets where the tokenizer has no such token (a
    model's vocabulary may be larger than its tokenizer's)."""
    if tokenizer is None:
        return str(token)
    if tokenizer.id_to_token(token) is None:
        return f"[{token}]"
    return token_bytes(tokenizer, token).decode("utf-8", errors="backslashreplace")


@dataclass(frozen=True)
class Exploration:
    """One sequence's tokens `[S]`, attention weights `[layers, heads, S, S]`, next-token probabilities
    `[S, vocab]` (row t: after token t) and head scores."""

    tokens: np.ndarray
    texts: list[str]
    attentions: np.ndarray
    probabilities: np.ndarray
    scores: HeadScores
    tokenizer: Tokenizer | None

    def summary(self, with_maps: bool = False) -> dict[str, Any]:
        """What the page draws first (module docstring); `with_maps`: every head's full map too, for a
        page that has no server to ask (`max-gpt2 heads --html`)."""
        layers, heads, length, _ = self.attentions.shape
        chosen = self.probabilities[np.arange(length - 1), self.tokens[1:]]  # token t given those before
        small = thumbnails(self.attentions)
        summary: dict[str, Any] = {
            "layers": layers,
            "heads": heads,
            "tokens": [{"id": int(t), "text": s} for t, s in zip(self.tokens, self.texts, strict=True)],
            "probabilities": [None, *(float(p) for p in chosen)],
            "alternatives": [None, *self.alternatives()],
            "scores": {kind: self.scores.of(kind).round(4).tolist() for kind in KINDS},
            "ranking": {kind: ranking(self.scores.of(kind)) for kind in KINDS},
            "thumbnails": {"size": small.shape[-1], "data": encoded(small)},
        }
        if with_maps:
            summary["maps"] = {"size": length, "data": encoded(self.attentions)}
        return summary

    def alternatives(self) -> list[list[dict[str, Any]]]:
        """After each token, the `ALTERNATIVES` likeliest next tokens, likeliest first: id, text and
        probability each."""
        likeliest = top(self.probabilities, ALTERNATIVES)  # [S, 5]
        chances = np.take_along_axis(self.probabilities, likeliest, axis=-1)
        return [
            [{"id": int(t), "text": text_of(self.tokenizer, int(t)), "p": float(p)} for t, p in row]
            for row in (zip(ts, ps, strict=True) for ts, ps in zip(likeliest, chances, strict=True))
        ]

    def head_map(self, layer: int, head: int | None) -> dict[str, Any]:
        """One head's full map, or (`head` None) the mean of the layer's heads, for the head view."""
        layers, heads, length, _ = self.attentions.shape
        if not 0 <= layer < layers or (head is not None and not 0 <= head < heads):
            raise ValueError(f"no head ({layer}, {head}): the model has {layers} layers of {heads} heads")
        weights = self.attentions[layer].mean(axis=0) if head is None else self.attentions[layer, head]
        return {"layer": layer, "head": head, "size": length, "data": encoded(weights)}


def explore(lm: CompiledLM, tokens: np.ndarray, tokenizer: Tokenizer | None = None) -> Exploration:
    """One forward pass of `tokens` `[S]` (S >= 2) through `lm`'s attention-weights graph."""
    tokens = np.asarray(tokens, np.int64)
    if len(tokens) < 2:
        raise ValueError(f"the text is {len(tokens)} token long; the explorer needs at least two tokens")
    logits, attentions = lm.logits_and_attentions(tokens[None])
    weights = attentions[:, 0]  # [layers, heads, S, S]
    texts = [text_of(tokenizer, int(token)) for token in tokens]
    probabilities = softmax(logits[0])
    return Exploration(tokens, texts, weights, probabilities, head_scores(weights, tokens), tokenizer)
