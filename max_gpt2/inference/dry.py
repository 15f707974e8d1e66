"""DRY ("Don't Repeat Yourself"), llama.cpp's penalty on the tokens that would make the text repeat
itself further: a token that would extend a run already seen earlier in the last `last_n` tokens loses
`multiplier * base ** (length - allowed_length)` from its logit, the run's length counted where it
reaches `allowed_length`, and no run crossing a sequence breaker (a string such as "\\n" that starts
the count again).

    heads = breaker_heads(["\\n", ":"], pieces, encode)        # once a vocabulary and set of breakers
    penalties(history, 0.8, 1.75, 2, 64, heads)              # {token id: what its logit loses}

As llama.cpp's `src/llama-sampler.cpp` (from Koboldcpp's) defines it: a breaker is found in the
token ids as every token whose text holds it, or whose text ends with its beginning, followed by the
tokens of the rest (at most 20); the last breaker in the window bounds every run's length, and a
token that is a breaker on its own is never penalised. Where the rest of a breaker cuts a character's
UTF-8 bytes (it has no text of its own to tokenize), that ending is left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Heads = dict[int, tuple[tuple[int, ...], ...]]  # a breaker's first token -> the tokens after it, each way
MOST_BYTES, MOST_TAIL = 40, 20  # a breaker's bytes, and its tokens after the first, kept (llama.cpp's)
FLOAT_MAX_LOG = 88.7228391  # the log of float32's largest: no penalty's exponent goes past it


def breaker_heads(
    breakers: Sequence[str], pieces: Sequence[bytes], encode: Callable[[str], list[int]]
) -> Heads:
    """Each token id that begins one of `breakers`, with the token ids that follow it in the breaker (none
    where the token's text holds it whole); `pieces` are the tokens' bytes by id, `encode` a text's ids."""
    heads: dict[int, list[tuple[int, ...]]] = {}
    for breaker in breakers:
        wanted = breaker.encode("utf-8")[:MOST_BYTES]
        for token, piece in enumerate(pieces):
            if not wanted or wanted[:1] not in piece:
                continue
            if wanted in piece:
                tails = [()]
            else:  # the piece ends with the breaker's beginning: the rest follows in other tokens
                tails = []
                for start in range(len(piece)):
                    if wanted.startswith(piece[start:]):
                        try:
                            rest = wanted[len(piece) - start :].decode("utf-8")
                        except UnicodeDecodeError:
                            continue
                        tails.append(tuple(encode(rest)[:MOST_TAIL]))
            for tail in tails:
                if tail not in heads.setdefault(token, []):
                    heads[token].append(tail)
    return {token: tuple(tails) for token, tails in heads.items()}


def penalties(
    history: Sequence[int] | np.ndarray,
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
    heads: Heads,
) -> dict[int, float]:
    """What each token's logit loses, by id, after `history` (the prompt's and text's ids); empty where DRY
    is off (`multiplier` 0, `base` below 1, `last_n` 0) or nothing repeats long enough."""
    if multiplier == 0 or base < 1 or last_n <= 0:
        return {}
    recent = [int(token) for token in np.asarray(history)[-last_n:][::-1]]  # the latest first
    if len(recent) <= allowed_length:
        return {}
    limit = run_limit(recent, heads)
    if limit < allowed_length:
        return {}
    longest: dict[int, int] = {}  # each token that would extend a run: the longest run it would extend
    for start, length in enumerate(matches(recent)[1:], start=1):
        length = min(length, limit)
        if length >= allowed_length:  # the run ends just before `recent[start - 1]`, which would extend it
            token = recent[start - 1]
            longest[token] = max(longest.get(token, 0), length)
    most = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = {}
    for token, length in longest.items():
        if () not in heads.get(token, ()):  # a breaker on its own is never penalised
            exponent = length - allowed_length
            out[token] = multiplier * base ** (min(exponent, most) if most > 0 else exponent)
    return out


def run_limit(recent: list[int], heads: Heads) -> int:
    """How long a run may be: the tokens after the latest breaker in `recent` (the latest token first),
    all of them where it holds none."""
    for position, token in enumerate(recent):
        found = -1
        for tail in heads.get(token, ()):
            if found < len(tail) <= position and all(
                tail[offset] == recent[position - offset - 1] for offset in range(len(tail))
            ):
                found = len(tail)
        if found >= 0:
            return position - found
    return len(recent)


def matches(tokens: list[int]) -> list[int]:
    """For each position k, how many tokens from k on equal those from the start (the Z-array, in linear
    time): with `tokens` the latest first, how long a run ending k tokens back repeats the latest one."""
    size = len(tokens)
    lengths, left, right = [0] * size, 0, 0
    for k in range(1, size):
        if k < right:
            lengths[k] = min(right - k, lengths[k - left])
        while k + lengths[k] < size and tokens[lengths[k]] == tokens[k + lengths[k]]:
            lengths[k] += 1
        if k + lengths[k] > right:
            left, right = k, k + lengths[k]
    return lengths
