"""The samplers of llama.cpp that pick the token themselves from what its chain kept (`sampler_chain`), in
place of a draw: Mirostat (the first, and 2.0) and adaptive-p, each learning from the tokens it picked.

    picker = ("mirostat", 2, 5.0, 0.1)   # version, tau, eta; or ("adaptive_p", 0.5, 0.9): target, decay
    state = first_state(picker)
    drawn, state = pick(picker, chain(logits, steps), state, draw)   # draw: uniform in [0, 1)
    drawn.token, drawn.ids, drawn.chances   # the token, and what it was drawn from

As llama.cpp's `src/llama-sampler.cpp` defines them. Both Mirostats steer the surprise, -log2 p, of
the tokens picked toward tau: 2.0 keeps the likeliest tokens whose surprise is within mu, the first the
k likeliest, k from Zipf's exponent estimated over the 100 likeliest, mu and the vocabulary's size; mu
starts at twice tau and moves by eta times each picked token's surprise less tau. Adaptive-p steers
the probability of the tokens picked toward `target`: each token's logit becomes a peak less how far
its probability lies from the target adapted by the average so far (decaying by `decay` a token), a
quadratic near it and linear in the tails, and the pick is drawn from that; the state is the decayed
sum of the picked tokens' probabilities and of their weights.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from max_gpt2.inference.sampler_chain import LOWEST, softmax

Picker = tuple[str | float, ...]  # its name and parameters; one type, as msgspec needs
WIDTH, SHARPNESS = 0.3, 10.0  # adaptive-p's transform (llama.cpp's; its peak, 5, cancels in the softmax)


class Drawn(NamedTuple):
    """A picker's token, and what it was drawn from: the ids in its order and their chances (summing to 1),
    as llama-server's `post_sampling_probs` reports them."""

    token: int
    ids: np.ndarray
    chances: np.ndarray


def first_state(picker: Picker) -> tuple[float, ...]:
    """`picker`'s state before its first token: Mirostat's mu, adaptive-p's sum and weight."""
    if picker[0] == "mirostat":
        return (2.0 * float(picker[2]),)
    target, decay = float(picker[1]), float(picker[2])
    return (target / (1 - decay), 1 / (1 - decay))


def pick(
    picker: Picker, logits: np.ndarray, state: tuple[float, ...], draw: float
) -> tuple[Drawn, tuple[float, ...]]:
    """The token `picker` picks from `logits` [V] (what the chain left) with `draw`, and its next state."""
    if picker[0] == "mirostat":
        _, version, tau, eta = picker
        choose = mirostat_v1 if version == 1 else mirostat_v2
        drawn, mu = choose(logits, float(tau), float(eta), state[0], draw)
        return drawn, (mu,)
    if picker[0] == "adaptive_p":
        _, target, decay = picker
        drawn, probability = adaptive_p(logits, float(target), *state, draw)
        return drawn, (probability + float(decay) * state[0], 1 + float(decay) * state[1])
    raise ValueError(f"no token picker {picker[0]!r}; the pickers are mirostat and adaptive_p")


def adaptive_p(
    logits: np.ndarray, target: float, weighted_sum: float, total_weight: float, draw: float
) -> tuple[Drawn, float]:
    """Adaptive-p's token from `logits` [V] with `draw`, and its probability before the transform."""
    kept, probabilities = in_play(logits)
    target = min(max(target, 0.0), 1.0)
    adapted = target if total_weight == 0 else 2 * target - weighted_sum / total_weight
    distance = np.abs(probabilities - min(max(adapted, 0.0), 1.0)) / WIDTH
    transformed = np.exp(-SHARPNESS * distance**2 / (1 + distance))
    chances = transformed / transformed.sum()
    index = drawn(chances, draw)
    return Drawn(int(kept[index]), kept, chances), float(probabilities[index])


def mirostat_v1(
    logits: np.ndarray, tau: float, eta: float, mu: float, draw: float, m: int = 100
) -> tuple[Drawn, float]:
    """The first Mirostat as llama.cpp runs it over `logits` [V] (already tempered): Zipf's exponent
    estimated from the `m` likeliest tokens, the top-k that would give a surprise of `mu` by it, the
    token `draw` (uniform in [0, 1)) picks among those k, renormalised, and the next `mu`, as 2.0's."""
    kept, probabilities = in_play(logits)
    ranked = probabilities[likeliest(probabilities, m)]
    steps = np.log(np.arange(2, ranked.size + 1) / np.arange(1, ranked.size))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        exponent = (steps * np.log(ranked[:-1] / ranked[1:])).sum() / (steps * steps).sum()
        k = ((exponent - 1) * 2.0**mu / (1 - float(np.size(logits)) ** (1 - exponent))) ** (1 / exponent)
    # A k that is no number, or past int32, converts to INT_MIN on x86 and so to 1, as llama.cpp's does.
    chosen = likeliest(probabilities, max(int(k), 1) if np.isfinite(k) and abs(k) < 2**31 else 1)
    picked = probabilities[chosen] / probabilities[chosen].sum()
    index = drawn(picked, draw)
    return Drawn(int(kept[chosen[index]]), kept[chosen], picked), mu - eta * (-np.log2(picked[index]) - tau)


def likeliest(probabilities: np.ndarray, count: int) -> np.ndarray:
    """The indices of the `count` largest `probabilities` (all where fewer), the largest first."""
    if count < probabilities.size:
        top = np.argpartition(-probabilities, count - 1)[:count]
        return top[np.argsort(-probabilities[top], kind="stable")]
    return np.argsort(-probabilities, kind="stable")


def mirostat_v2(logits: np.ndarray, tau: float, eta: float, mu: float, draw: float) -> tuple[Drawn, float]:
    """Mirostat 2.0 as llama.cpp runs it over `logits` [V] (already tempered): the token `draw` (uniform
    in [0, 1)) picks among the likeliest whose surprise, -log2 p, is at most `mu` (the likeliest at
    least), renormalised, and the next `mu`: less `eta` times the picked token's surprise over `tau`."""
    kept, probabilities = in_play(logits)
    # The likeliest tokens up to the first whose surprise passes mu are those within it: only they are
    # sorted (a whole vocabulary's sort cost 11 ms a token, 2-3 ms with it; docs/llama-server.md).
    within = np.flatnonzero(probabilities >= 2.0**-mu)  # -log2 p <= mu
    if within.size == 0:
        within = np.array([np.argmax(probabilities)])
    within = within[np.argsort(-probabilities[within], kind="stable")]
    chosen = probabilities[within] / probabilities[within].sum()
    index = drawn(chosen, draw)
    return Drawn(int(kept[within[index]]), kept[within], chosen), mu - eta * (-np.log2(chosen[index]) - tau)


def in_play(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ids `logits` [V] leave in play (above the lowest float32: not cut, banned or masked), and
    their probabilities."""
    row = np.asarray(logits, dtype=np.float64)
    kept = np.flatnonzero(row > LOWEST)
    return kept, softmax(row[kept])


def drawn(chances: np.ndarray, draw: float) -> int:
    """The index `draw` (uniform in [0, 1)) picks among `chances`, which sum to 1, in their order."""
    return min(int(np.searchsorted(np.cumsum(chances), draw, side="right")), chances.size - 1)
