"""How much each head behaves as a previous-token, duplicate-token or induction head, as TransformerLens's
`head_detector` scores it.

For one sequence of tokens t[0..S-1] and a head's attention weights A `[S, S]` (row i: where
query i looks, summing to 1), each kind of head has a detection pattern P `[S, S]` of 0s and 1s,
and the score is the share of all the head's weight that falls on P: sum(A * P) / sum(A).

    previous-token   P[i, i - 1] = 1: each token looks at the one before it
    duplicate-token  P[i, j] = 1 for j < i with t[j] = t[i]: at the earlier copies of itself
    induction        P[i, j + 1] = 1 for j < i with t[j] = t[i] (and j + 1 <= i): at the token that
                     followed an earlier copy of itself, which an induction head predicts comes next

A random token sequence repeated (`repeated_random_tokens`) makes every token of the second copy
a duplicate, so induction heads stand out there. `ranking` orders the heads by a score.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

KINDS = ("previous-token", "duplicate-token", "induction")


class HeadScores(NamedTuple):
    """Each head's score of each kind, float64 `[layers, heads]`, in the order of `KINDS`."""

    previous: np.ndarray
    duplicate: np.ndarray
    induction: np.ndarray

    def of(self, kind: str) -> np.ndarray:
        return self[KINDS.index(kind)]


def detection_patterns(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Each kind's pattern P for `tokens` `[S]` (module docstring), bool `[S, S]`."""
    length = len(tokens)
    earlier = np.tril(np.ones((length, length), bool), k=-1)  # j < i
    duplicate = earlier & (tokens[:, None] == tokens[None, :])
    induction = np.zeros((length, length), bool)
    induction[:, 1:] = duplicate[:, :-1]  # j + 1, for each earlier copy j
    induction &= np.tril(np.ones((length, length), bool))  # j + 1 <= i
    previous = np.eye(length, k=-1, dtype=bool)
    return {"previous-token": previous, "duplicate-token": duplicate, "induction": induction}


def head_scores(attentions: np.ndarray, tokens: np.ndarray) -> HeadScores:
    """The scores of every head of `attentions` `[layers, heads, S, S]` on one sequence `tokens` `[S]`
    (summed in float64; only the weights on each pattern's cells are read)."""
    weights = np.asarray(attentions)
    total = weights.sum(axis=(-2, -1), dtype=np.float64)  # [layers, heads]
    patterns = detection_patterns(np.asarray(tokens))
    cells = [np.nonzero(patterns[kind]) for kind in KINDS]  # (rows, columns) of each pattern's 1s
    on = [weights[..., rows, columns].sum(axis=-1, dtype=np.float64) for rows, columns in cells]
    return HeadScores(*(np.divide(s, total, out=np.zeros_like(total), where=total > 0) for s in on))


def ranking(scores: np.ndarray, top: int = 5) -> list[tuple[int, int, float]]:
    """The `top` heads by `scores` `[layers, heads]`, highest first: (layer, head, score)."""
    order = np.argsort(-scores, axis=None, kind="stable")[:top]
    return [(int(i // scores.shape[1]), int(i % scores.shape[1]), float(scores.flat[i])) for i in order]


def repeated_random_tokens(
    vocab_size: int, length: int, seed: int = 0, avoid: int | None = None
) -> np.ndarray:
    """`length` random token ids, then the same again: int64 `[2 * length]` (`avoid`: an id never drawn,
    such as the end of text)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size - (avoid is not None), length)
    if avoid is not None:
        ids[ids >= avoid] += 1
    return np.concatenate([ids, ids]).astype(np.int64)
