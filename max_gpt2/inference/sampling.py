"""Choosing the next token from the logits: greedy, or sampled with temperature, top-k and top-p.

The filters apply in Hugging Face's order (temperature, then top-k, then top-p),
in float64 on the host: the logits of one step are `[batch, vocab]`, small next
to the model that made them. Sampling draws from a NumPy generator seeded once per
generation, so the same seed gives the same tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Sampler:
    """How to pick each next token; checked when made, so bad settings fail before any work."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature must be a positive number, got {temperature!r}")
        top_k = self.top_k
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        top_p = self.top_p
        if top_p is not None and (
            isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
        ):
            raise ValueError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")

    def candidates(self, logits: np.ndarray) -> np.ndarray:
        """`logits` [B, V] scaled by the temperature, with every token outside top-k and top-p at -inf."""
        scores = np.asarray(logits, dtype=np.float64) / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth_largest = -np.partition(-scores, self.top_k - 1, axis=-1)[:, self.top_k - 1 : self.top_k]
            scores = np.where(scores < kth_largest, -np.inf, scores)
        if self.top_p is not None and self.top_p < 1:
            order = np.argsort(-scores, axis=-1, kind="stable")  # most likely first
            probabilities = np.take_along_axis(softmax(scores), order, axis=-1)
            # Keep the most likely tokens until their mass reaches top_p, the one that crosses it included.
            mass_before = np.cumsum(probabilities, axis=-1) - probabilities
            dropped = np.zeros(scores.shape, dtype=bool)
            np.put_along_axis(dropped, order, mass_before >= self.top_p, axis=-1)
            scores = np.where(dropped, -np.inf, scores)
        return scores

    def generator(self) -> np.random.Generator:
        """A fresh random generator for one generation: same seed, same draws."""
        return np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The next token of each row, int64 [B], from `logits` [B, V]."""
        if not self.do_sample:
            return np.argmax(logits, axis=-1).astype(np.int64)
        cumulative = np.cumsum(softmax(self.candidates(logits)), axis=-1)
        draws = rng.random((cumulative.shape[0], 1)) * cumulative[:, -1:]
        # The first token whose cumulative probability passes the draw; tokens of zero mass never are.
        return np.minimum((cumulative <= draws).sum(axis=-1), cumulative.shape[-1] - 1).astype(np.int64)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; -inf entries get probability 0."""
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
