"""Choosing the next token from the logits: the logits controls, then greedy, or sampled with
temperature, top-k, top-p and min-p.

    sampler = Sampler(repetition_penalty=1.3, no_repeat_ngram_size=3)        # greedy, controlled
    sampler = Sampler(do_sample=True, temperature=0.8, top_k=40, min_p=0.05, seed=1)
    scores = sampler.controlled(logits, history)    # [B, V]: the controls (`TokenHistory` of the rows)
    tokens = sampler(scores, sampler.generator())   # [B]: the warpers (when sampling), then the pick

The controls apply greedy and sampled alike, in Hugging Face's order: `logit_bias`
(its `SequenceBiasLogitsProcessor` with one-token sequences), `repetition_penalty`, then
OpenAI's `frequency_penalty` and `presence_penalty`, then `no_repeat_ngram_size`
(`max_gpt2.inference.logit_controls`). Sampling then applies temperature, top-k, top-p and
min-p, Hugging Face's warpers in its order, in float64 on the host: the logits of one
step are `[batch, vocab]`, small next to the model that made them. Sampling draws from a
NumPy generator seeded once per generation, so the same seed gives the same tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from max_gpt2.inference.logit_controls import LOWEST, penalize
from max_gpt2.inference.token_history import TokenHistory


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: _number(v) and 0 < v < math.inf, "a positive finite number"),
    "seed": (lambda v: v is None or (_integer(v) and v >= 0), "an integer of 0 or more, or None"),
    "top_k": (lambda v: v is None or (_integer(v) and v >= 1), "a positive integer or None"),
    "top_p": (lambda v: v is None or (_number(v) and 0 < v <= 1), "a number in (0, 1] or None"),
    "min_p": (lambda v: v is None or (_number(v) and 0 <= v <= 1), "a number in [0, 1] or None"),
    "repetition_penalty": (lambda v: _number(v) and v > 0, "a positive number (1: none)"),
    "no_repeat_ngram_size": (lambda v: _integer(v) and v >= 0, "an integer of 0 (none) or more"),
    "frequency_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number in [-2, 2]"),
    "presence_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number in [-2, 2]"),
}
"""Each numeric setting's test, and what it must be (OpenAI's range for its two penalties)."""


SAMPLING_ONLY = {"temperature": 1.0, "top_k": None, "top_p": None, "min_p": None, "seed": None}
"""The settings only sampling reads, at the values that change nothing."""


@dataclasses.dataclass(frozen=True)
class Sampler:
    """How to pick each next token; checked when made, so bad settings fail before any work.

    `logit_bias` maps token ids to a value added to their logit, as OpenAI's
    (-100 bans a token, 100 all but forces it); the ids are checked against the
    vocabulary when a generation starts.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        for name, (valid, wanted) in RANGES.items():
            if not valid(getattr(self, name)):
                raise ValueError(f"{name} must be {wanted}, got {getattr(self, name)!r}")
        unused = [name for name, default in SAMPLING_ONLY.items() if getattr(self, name) != default]
        if unused and not self.do_sample:  # Hugging Face's generation config warns the same
            given = ", ".join(f"{name}={getattr(self, name)!r}" for name in unused)
            warnings.warn(
                f"do_sample is False: greedy decoding leaves {given} unused; do_sample=True samples",
                stacklevel=3,
            )
        if self.logit_bias is not None:
            bias = self.logit_bias
            valid = isinstance(bias, Mapping) and all(
                _integer(id_) and id_ >= 0 and _number(value) and -100 <= value <= 100
                for id_, value in bias.items()
            )
            if not valid:
                raise ValueError(f"logit_bias must map token ids to numbers in [-100, 100], got {bias!r}")
            object.__setattr__(self, "logit_bias", types.MappingProxyType(dict(bias)))

    @functools.cached_property
    def _bias(self) -> tuple[np.ndarray, np.ndarray]:
        """`logit_bias` as ids int64 [n] and values float32 [n]."""
        bias = self.logit_bias or {}
        return np.array(list(bias), dtype=np.int64), np.array(list(bias.values()), dtype=np.float32)

    @property
    def controls(self) -> bool:
        """Whether any logits control is set (else `controlled` returns the logits as they are)."""
        return bool(
            self.logit_bias
            or self.repetition_penalty != 1
            or self.no_repeat_ngram_size
            or self.frequency_penalty
            or self.presence_penalty
        )

    def check_vocabulary(self, vocab: int) -> None:
        """Refuses `logit_bias` ids outside a vocabulary of `vocab` tokens."""
        if outside := [id_ for id_ in self.logit_bias or {} if id_ >= vocab]:
            raise ValueError(f"logit_bias ids {outside} are outside the vocabulary (0..{vocab - 1})")

    def history(self, ids: np.ndarray, mask: np.ndarray, vocab: int) -> TokenHistory | None:
        """What `controlled` needs of rows whose prompts are `ids` and `mask` [B, S] (None: no controls)."""
        return TokenHistory(ids, mask, vocab, self.no_repeat_ngram_size) if self.controls else None

    def controlled(self, logits: np.ndarray, history: TokenHistory | None) -> np.ndarray:
        """`logits` [B, V] with the controls applied (see the module's docstring), float32."""
        if history is None:
            return logits
        ids, values = self._bias
        scores = np.array(logits, dtype=np.float32)
        scores[:, ids] += values
        scores = penalize(
            scores,
            history.seen,
            history.generated,
            self.repetition_penalty,
            self.frequency_penalty,
            self.presence_penalty,
        )
        if self.no_repeat_ngram_size:
            for row, banned in enumerate(history.banned_ngrams()):
                scores[row, list(banned)] = LOWEST
        return scores

    def candidates(self, logits: np.ndarray) -> np.ndarray:
        """`logits` [B, V] scaled by the temperature, with every token outside top-k, top-p and min-p at
        -inf."""
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
        if self.min_p:
            # Hugging Face's MinPLogitsWarper: drop tokens less likely than min_p times the most likely.
            probabilities = softmax(scores)
            dropped = probabilities < self.min_p * probabilities.max(axis=-1, keepdims=True)
            scores = np.where(dropped, -np.inf, scores)
        return scores

    def generator(self) -> np.random.Generator:
        """A fresh random generator for one generation: same seed, same draws."""
        return np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The next token of each row, int64 [B], from `logits` [B, V] (already `controlled`)."""
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
