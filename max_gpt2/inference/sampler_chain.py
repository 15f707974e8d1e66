"""llama.cpp's sampler chain on one row of logits: DRY, top-n-sigma, top-k, typical-p, top-p, min-p, XTC
and temperature, in a given order (what picks the token from it, where not a draw:
`max_gpt2.inference.token_pickers`).

    row = chain(logits, (("top_k", 40), ("top_p", 0.95), ("min_p", 0.05), ("temperature", 0.8)))  # [V]
    row = chain(logits, (("xtc", 0.5, 0.1), ("temperature", 0.8)), chance=0.3)  # XTC's draw this token
    row = chain(logits, (("dry", 0.8, 1.75, 2, 64), ("temperature", 0.8, 0.5, 1.0)), history=ids, heads=heads)

llama.cpp cuts the distribution in its chain's order, by default the cuts first, at the
model's own temperature, then the temperature; Hugging Face's, vLLM's and MAX's samplers
apply the temperature first. Where the two orders keep different tokens (a temperature
other than 0 or 1 beside a cut), or a step MAX's sampler has not acts (DRY, top-n-sigma, typical-p,
XTC, a dynamic temperature), `max-gpt2 serve` runs llama-server's chain here for its
`/completion` route and lets MAX's sampler draw from the result at temperature 1. Each step
is llama.cpp's (`src/llama-sampler.cpp`): top-k keeps the `k` highest logits (0: all);
top-p keeps the likeliest tokens until their probability, over what is still kept, reaches
`p`; min-p keeps the tokens whose probability is at least `p` times the likeliest one's;
temperature divides what is kept (0 keeps the likeliest alone), and where it has a range and an
exponent (llama.cpp's dynamic temperature), it is the temperature less the range plus twice the range
times the kept distribution's entropy over its largest, to the exponent (at least 0); DRY subtracts
`max_gpt2.inference.dry.penalties` over the `history` of ids (multiplier, base, allowed length and
window its values, `heads` its breakers); top-n-sigma keeps the logits within
`n` standard deviations (of what is kept) of the highest (0 or less: all); typical-p ranks what is kept
by how far each token's surprise, -log p, lies from the entropy, and keeps the closest until their
probability passes `p` (1: all); XTC ("exclude top choices"), where this token's `chance` (a uniform
draw in [0, 1)) is at most its probability, cuts every token whose probability is at least its
threshold but the least likely of them (a threshold above 0.5: none). A cut token gets the lowest
float32 logit (as `max_gpt2.inference.logit_controls.ban`), so no sampler picks it; at least one token
stays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from max_gpt2.inference.dry import Heads, penalties

STEPS = ("dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")  # llama.cpp's order
Step = tuple[str | float, ...]  # a name of `STEPS`, its values; one type, as msgspec needs
LOWEST = np.finfo(np.float32).min
NUCLEUS_FIRST = 256  # top-p looks among this many likeliest first, as llama.cpp does


def chain(
    logits: np.ndarray,
    steps: Sequence[Step],
    chance: float = 1.0,
    history: Sequence[int] | np.ndarray = (),
    heads: Heads | None = None,
) -> np.ndarray:
    """`logits` [V] after each step of `steps` (a name of `STEPS` and its values: XTC's probability and
    threshold, DRY's four, a temperature's range and exponent where dynamic; top-p's, min-p's,
    typical-p's and XTC's last, where given, llama.cpp's `min_keep`: what each leaves at least), in their
    order; `chance` is XTC's draw for this token, `history` the ids before it and `heads` DRY's breakers."""
    row = np.asarray(logits, dtype=np.float32)
    kept = np.flatnonzero(row > LOWEST)  # ids still in play: what a ban or a constraint left
    if kept.size == 0:
        return row.copy()
    values = row[kept]
    for name, value, *more in steps:
        if name == "top_k" and 0 < value < kept.size:
            best = np.argpartition(-values, int(value) - 1)[: int(value)]
            kept, values = kept[best], values[best]
        elif name == "top_p" and value < 1:
            kept, values = nucleus(kept, values, value, *more)
        elif name == "top_n_sigma" and value > 0 and kept.size > 1:
            close = values >= values.max() - np.float32(value) * values.std()
            kept, values = kept[close], values[close]
        elif name == "typ_p" and value < 1:
            kept, values = typical(kept, values, value, *more)
        elif name == "xtc" and chance <= value and more[0] <= 0.5 and kept.size > 1:
            kept, values = excluded_top_choices(kept, values, *more)
        elif name == "min_p" and value > 0:
            close = values >= values.max() + np.log(np.float32(value))
            if np.count_nonzero(close) < (least := int(more[0]) if more else 0):  # the likeliest `min_keep`
                close = np.isin(np.arange(kept.size), np.argsort(-values, kind="stable")[:least])
            kept, values = kept[close], values[close]
        elif name == "dry" and (lost := penalties(history, value, more[0], *map(int, more[1:]), heads or {})):
            loss = np.zeros(row.size, np.float32)
            loss[list(lost)] = list(lost.values())
            values = values - loss[kept]
        elif name == "temperature":
            temperature = dynamic(values, value, *more) if more and more[0] > 0 and kept.size > 1 else value
            if temperature > 0:
                values = values / np.float32(temperature)
            else:  # the likeliest alone, as llama.cpp's greedy temperature
                best = np.argmax(values)
                kept, values = kept[best : best + 1], values[best : best + 1]
        elif name not in STEPS:
            raise ValueError(f"sampler chain: no step {name!r}; the steps are {', '.join(STEPS)}")
    out = np.full_like(row, LOWEST)
    out[kept] = values
    return out


def softmax(values: np.ndarray) -> np.ndarray:
    """The probabilities of the logits `values`, in float64."""
    probabilities = np.exp(values.astype(np.float64) - values.max())
    return probabilities / probabilities.sum()


def dynamic(values: np.ndarray, temperature: float, spread: float, exponent: float) -> float:
    """llama.cpp's dynamic temperature for the kept `values`: from `temperature` less `spread` (at least
    0) to `temperature` plus it, as their entropy over its largest, to the `exponent`."""
    probabilities = softmax(values)
    within = probabilities[probabilities > 0]
    entropy = -(within * np.log(within)).sum() / np.log(values.size)
    low, high = max(0.0, temperature - spread), temperature + spread
    return float(low + (high - low) * entropy**exponent)


def nucleus(
    kept: np.ndarray, values: np.ndarray, p: float, least: float = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The likeliest of `kept` (with their `values`) whose probability over all of `kept` reaches `p`, at
    least `least` of them (llama.cpp's `min_keep`)."""
    probabilities = softmax(values)
    least = int(least)
    first = kept.size if kept.size <= max(NUCLEUS_FIRST, least) else max(NUCLEUS_FIRST, least)
    while True:
        likeliest = (
            np.argpartition(-probabilities, first - 1)[:first] if first < kept.size else np.arange(first)
        )
        order = likeliest[np.argsort(-probabilities[likeliest], kind="stable")]
        reached = np.flatnonzero((np.cumsum(probabilities[order]) >= p) & (np.arange(first) + 1 >= least))
        if reached.size or first == kept.size:
            last = reached[0] + 1 if reached.size else first
            return kept[order[:last]], values[order[:last]]
        first = kept.size


def typical(
    kept: np.ndarray, values: np.ndarray, p: float, least: float = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `kept` (with their `values`) whose surprise is closest to the entropy, until their
    probability over all of `kept` passes `p` (at least one, and at least `least`: `min_keep`)."""
    probabilities = softmax(values)
    surprise = -np.log(probabilities)
    order = np.argsort(np.abs(surprise - (probabilities * surprise).sum()), kind="stable")
    passed = np.flatnonzero((np.cumsum(probabilities[order]) > p) & (np.arange(kept.size) + 1 >= least))
    last = passed[0] + 1 if passed.size else kept.size
    return kept[order[:last]], values[order[:last]]


def excluded_top_choices(
    kept: np.ndarray, values: np.ndarray, threshold: float, least: float = 0
) -> tuple[np.ndarray, np.ndarray]:
    """`kept` (with their `values`) less the tokens of probability at least `threshold`, all but the least
    likely of them; as it is where fewer than two reach it, or fewer than `least` would stay."""
    probabilities = softmax(values)
    order = np.argsort(-values, kind="stable")
    reaching = int(np.count_nonzero(probabilities >= threshold))  # the likeliest, a prefix of `order`
    if reaching < 2 or kept.size - (reaching - 1) < least:
        return kept, values
    rest = order[reaching - 1 :]
    return kept[rest], values[rest]
