"""llama.cpp's sampler chain on one row of logits: top-n-sigma, top-k, typical-p, top-p, min-p, XTC and
temperature, in a given order; and its Mirostat 2.0, which replaces the chain but for the temperature.

    row = chain(logits, (("top_k", 40), ("top_p", 0.95), ("min_p", 0.05), ("temperature", 0.8)))  # [V]
    row = chain(logits, (("xtc", 0.5, 0.1), ("temperature", 0.8)), chance=0.3)  # XTC's draw this token
    token, mu = mirostat_v2(chain(logits, (("temperature", 0.8),)), tau=5.0, eta=0.1, mu=10.0, draw=0.4)

llama.cpp cuts the distribution in its chain's order, by default the cuts first, at the
model's own temperature, then the temperature; Hugging Face's, vLLM's and MAX's samplers
apply the temperature first. Where the two orders keep different tokens (a temperature
other than 0 or 1 beside a cut), or a step MAX's sampler has not acts (top-n-sigma, typical-p,
XTC), `max-gpt2 serve` runs llama-server's chain here for its
`/completion` route and lets MAX's sampler draw from the result at temperature 1. Each step
is llama.cpp's (`src/llama-sampler.cpp`): top-k keeps the `k` highest logits (0: all);
top-p keeps the likeliest tokens until their probability, over what is still kept, reaches
`p`; min-p keeps the tokens whose probability is at least `p` times the likeliest one's;
temperature divides what is kept (0 keeps the likeliest alone); top-n-sigma keeps the logits within
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

STEPS = ("top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")  # llama.cpp's order
Step = tuple[str | float, ...]  # a name of `STEPS`, its value (XTC's two); one type, as msgspec needs
LOWEST = np.finfo(np.float32).min
NUCLEUS_FIRST = 256  # top-p looks among this many likeliest first, as llama.cpp does


def chain(logits: np.ndarray, steps: Sequence[Step], chance: float = 1.0) -> np.ndarray:
    """`logits` [V] after each step of `steps` (a name of `STEPS` and its value: XTC's probability and
    threshold), in their order; `chance` is XTC's draw for this token."""
    row = np.asarray(logits, dtype=np.float32)
    kept = np.flatnonzero(row > LOWEST)  # ids still in play: what a ban or a constraint left
    if kept.size == 0:
        return row.copy()
    values = row[kept]
    for name, value, *threshold in steps:
        if name == "top_k" and 0 < value < kept.size:
            best = np.argpartition(-values, int(value) - 1)[: int(value)]
            kept, values = kept[best], values[best]
        elif name == "top_p" and value < 1:
            kept, values = nucleus(kept, values, value)
        elif name == "top_n_sigma" and value > 0 and kept.size > 1:
            close = values >= values.max() - np.float32(value) * values.std()
            kept, values = kept[close], values[close]
        elif name == "typ_p" and value < 1:
            kept, values = typical(kept, values, value)
        elif name == "xtc" and chance <= value and threshold[0] <= 0.5 and kept.size > 1:
            kept, values = excluded_top_choices(kept, values, threshold[0])
        elif name == "min_p" and value > 0:
            close = values >= values.max() + np.log(np.float32(value))
            kept, values = kept[close], values[close]
        elif name == "temperature" and value > 0:
            values = values / np.float32(value)
        elif name == "temperature":  # 0: the likeliest alone, as llama.cpp's greedy temperature
            best = np.argmax(values)
            kept, values = kept[best : best + 1], values[best : best + 1]
        elif name not in STEPS:
            raise ValueError(f"sampler chain: no step {name!r}; the steps are {', '.join(STEPS)}")
    out = np.full_like(row, LOWEST)
    out[kept] = values
    return out


def nucleus(kept: np.ndarray, values: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """The likeliest of `kept` (with their `values`) whose probability over all of `kept` reaches `p`."""
    probabilities = np.exp(values.astype(np.float64) - values.max())
    probabilities /= probabilities.sum()
    first = kept.size if kept.size <= NUCLEUS_FIRST else NUCLEUS_FIRST
    while True:
        likeliest = (
            np.argpartition(-probabilities, first - 1)[:first] if first < kept.size else np.arange(first)
        )
        order = likeliest[np.argsort(-probabilities[likeliest], kind="stable")]
        reached = np.flatnonzero(np.cumsum(probabilities[order]) >= p)
        if reached.size or first == kept.size:
            last = reached[0] + 1 if reached.size else first
            return kept[order[:last]], values[order[:last]]
        first = kept.size


def typical(kept: np.ndarray, values: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `kept` (with their `values`) whose surprise is closest to the entropy, until their
    probability over all of `kept` passes `p` (at least one)."""
    probabilities = np.exp(values.astype(np.float64) - values.max())
    probabilities /= probabilities.sum()
    surprise = -np.log(probabilities)
    order = np.argsort(np.abs(surprise - (probabilities * surprise).sum()), kind="stable")
    passed = np.flatnonzero(np.cumsum(probabilities[order]) > p)
    last = passed[0] + 1 if passed.size else kept.size
    return kept[order[:last]], values[order[:last]]


def excluded_top_choices(
    kept: np.ndarray, values: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """`kept` (with their `values`) less the tokens of probability at least `threshold`, all but the least
    likely of them; as it is where fewer than two reach it."""
    probabilities = np.exp(values.astype(np.float64) - values.max())
    probabilities /= probabilities.sum()
    order = np.argsort(-values, kind="stable")
    reaching = int(np.count_nonzero(probabilities >= threshold))  # the likeliest, a prefix of `order`
    if reaching < 2:
        return kept, values
    rest = order[reaching - 1 :]
    return kept[rest], values[rest]


def mirostat_v2(logits: np.ndarray, tau: float, eta: float, mu: float, draw: float) -> tuple[int, float]:
    """Mirostat 2.0 as llama.cpp runs it over `logits` [V] (already tempered): the token `draw` (uniform
    in [0, 1)) picks among the likeliest whose surprise, -log2 p, is at most `mu` (the likeliest at
    least), renormalised, and the next `mu`: less `eta` times the picked token's surprise over `tau`."""
    row = np.asarray(logits, dtype=np.float64)
    kept = np.flatnonzero(row > LOWEST)
    probabilities = np.exp(row[kept] - row[kept].max())
    probabilities /= probabilities.sum()
    # The likeliest tokens up to the first whose surprise passes mu are those within it: only they are
    # sorted (a whole vocabulary's sort cost 11 ms a token, 2-3 ms with it; docs/llama-server.md).
    within = np.flatnonzero(probabilities >= 2.0**-mu)  # -log2 p <= mu
    if within.size == 0:
        within = np.array([np.argmax(probabilities)])
    within = within[np.argsort(-probabilities[within], kind="stable")]
    chosen = probabilities[within] / probabilities[within].sum()
    index = min(int(np.searchsorted(np.cumsum(chosen), draw, side="right")), within.size - 1)
    return int(kept[within[index]]), mu - eta * (-np.log2(chosen[index]) - tau)
