"""llama.cpp's sampler chain (`max_gpt2.inference.sampler_chain`) and token pickers (`token_pickers`)
against a plain reference written here from llama.cpp's definitions (`src/llama-sampler.cpp`): sorted
lists in float64, one token at a time, min-p's threshold in float32 as llama.cpp computes it. Random
rows of logits, every order of the four steps llama-server runs by default, top-n-sigma and typical-p
among them, the dynamic temperature, both Mirostats and adaptive-p (DRY's: `tests/test_dry.py`)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from max_gpt2.inference.sampler_chain import LOWEST, STEPS, chain
from max_gpt2.inference.token_pickers import adaptive_p, first_state, mirostat_v1, mirostat_v2, pick

DEFAULTS = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8}  # llama-server's
CUTS = {"top_n_sigma": 1.5, "typ_p": 0.7}  # llama-server's are off (-1, 1): values that cut
ONE_VALUE = tuple(step for step in STEPS if step not in ("xtc", "dry"))  # one value each, llama.cpp's order


def reference(logits: np.ndarray, steps: list[tuple], chance: float = 1.0) -> dict[int, float]:
    """The tokens each step keeps, by id, with their logits (`chance`: XTC's draw; a cut's last value,
    where given, its `min_keep`)."""
    kept = {index: float(value) for index, value in enumerate(logits) if value > LOWEST}
    for name, value, *more in steps:
        ranked = sorted(kept, key=lambda index: -kept[index])
        least = int(more[-1]) if more and name in ("top_p", "min_p", "typ_p", "xtc") else 0
        if name == "xtc" and len(more) < 2:
            least = 0
        if name == "top_k" and value > 0:
            kept = {index: kept[index] for index in ranked[: int(value)]}
        elif name == "top_p" and value < 1:
            top = kept[ranked[0]]
            total = sum(math.exp(kept[index] - top) for index in ranked)
            chosen, mass = [], 0.0
            for index in ranked:
                chosen.append(index)
                mass += math.exp(kept[index] - top) / total
                if mass >= value and len(chosen) >= least:
                    break
            kept = {index: kept[index] for index in chosen}
        elif name == "top_n_sigma" and value > 0 and len(kept) > 1:
            mean = sum(kept.values()) / len(kept)
            sigma = math.sqrt(sum((logit - mean) ** 2 for logit in kept.values()) / len(kept))
            kept = {index: logit for index, logit in kept.items() if logit >= kept[ranked[0]] - value * sigma}
        elif name == "typ_p" and value < 1:
            top = kept[ranked[0]]
            total = sum(math.exp(kept[index] - top) for index in ranked)
            probability = {index: math.exp(kept[index] - top) / total for index in ranked}
            entropy = -sum(p * math.log(p) for p in probability.values())
            typical = sorted(ranked, key=lambda index: abs(-math.log(probability[index]) - entropy))
            chosen, mass = [], 0.0
            for index in typical:
                chosen.append(index)
                mass += probability[index]
                if mass > value and len(chosen) >= least:
                    break
            kept = {index: kept[index] for index in chosen}
        elif name == "xtc" and chance <= value and more[0] <= 0.5 and len(kept) > 1:
            top = kept[ranked[0]]
            total = sum(math.exp(kept[index] - top) for index in ranked)
            last = 0  # where the tokens that reach the threshold end, as llama.cpp's `pos_last`
            for position, index in enumerate(ranked):
                if math.exp(kept[index] - top) / total < more[0]:
                    break
                last = position
            if len(ranked) - last >= least:
                kept = {index: kept[index] for index in ranked[last:]}
        elif name == "min_p" and value > 0:
            floor = np.float32(kept[ranked[0]]) + np.log(np.float32(value))
            passing = {index: logit for index, logit in kept.items() if np.float32(logit) >= floor}
            kept = passing if len(passing) >= least else {index: kept[index] for index in ranked[:least]}
        elif name == "temperature":
            if more and more[0] > 0 and len(kept) > 1:  # dynamic: from the entropy over its largest
                top = kept[ranked[0]]
                total = sum(math.exp(kept[index] - top) for index in ranked)
                probabilities = [math.exp(kept[index] - top) / total for index in ranked]
                entropy = -sum(p * math.log(p) for p in probabilities if p > 0)
                low, high = max(0.0, value - more[0]), value + more[0]
                value = low + (high - low) * (entropy / -math.log(1 / len(kept))) ** more[1]
            if value > 0:
                kept = {index: logit / value for index, logit in kept.items()}
            else:
                kept = {ranked[0]: kept[ranked[0]]}
    return kept


def rows(count: int, vocab: int = 3000) -> list[np.ndarray]:
    generator = np.random.default_rng(7)
    return [
        (generator.normal(size=vocab) * generator.uniform(0.5, 4)).astype(np.float32) for _ in range(count)
    ]


def kept_by(out: np.ndarray) -> dict[int, float]:
    return {int(index): float(out[index]) for index in np.flatnonzero(out > LOWEST)}


@pytest.mark.parametrize("order", list(itertools.permutations(DEFAULTS)))
def test_every_order_keeps_and_tempers_what_llama_cpps_chain_does(order):
    for row in rows(6):
        steps = [(name, DEFAULTS[name]) for name in order]
        found, expected = kept_by(chain(row, steps)), reference(row, steps)
        assert found.keys() == expected.keys(), order
        assert np.allclose([found[i] for i in expected], list(expected.values()), rtol=1e-6)


@pytest.mark.parametrize(
    "steps",
    [
        [("top_p", 0.5), ("temperature", 0.3)],  # a nucleus past the first 256 tokens' search
        [("top_p", 0.999), ("temperature", 1.5)],
        [("top_k", 5), ("top_k", 2)],
        [("min_p", 0.9)],
        [("top_p", 0.0)],  # the likeliest alone
        [("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("temperature", 1.0)],  # each off
    ],
)
def test_single_steps_and_their_edges(steps):
    for row in rows(4, vocab=50257):
        found, expected = kept_by(chain(row, steps)), reference(row, steps)
        assert found.keys() == expected.keys() and len(found) >= 1
        assert np.allclose([found[i] for i in expected], list(expected.values()), rtol=1e-6)


@pytest.mark.parametrize(
    "order", [ONE_VALUE, ONE_VALUE[::-1], ("typ_p", "top_n_sigma", "temperature"), ("top_n_sigma",)]
)
@pytest.mark.parametrize(
    "cuts", [CUTS, {"top_n_sigma": 0.5, "typ_p": 0.2}, {"top_n_sigma": 3, "typ_p": 0.95}]
)
def test_top_n_sigma_and_typical_p_keep_what_llama_cpps_do_in_any_order(order, cuts):
    for row in rows(4):
        steps = [(name, {**DEFAULTS, **cuts}[name]) for name in order]
        found, expected = kept_by(chain(row, steps)), reference(row, steps)
        assert found.keys() == expected.keys() and len(found) >= 1, order
        assert np.allclose([found[i] for i in expected], list(expected.values()), rtol=1e-6)
    alone = [kept_by(chain(row, [(name, cuts[name])])) for name in CUTS for row in rows(1)]
    assert all(0 < len(kept) < 3000 for kept in alone)  # each cuts, so the comparison can fail


@pytest.mark.parametrize("chance", [0.2, 0.7])
@pytest.mark.parametrize("threshold", [0.0005, 0.002, 0.3, 0.6])
def test_xtc_cuts_the_top_choices_but_the_least_likely_where_its_draw_falls_within_its_probability(
    chance, threshold
):
    for row in rows(4):
        steps = [("top_k", 40), ("xtc", 0.5, threshold), ("temperature", 0.8)]
        found, expected = kept_by(chain(row, steps, chance)), reference(row, steps, chance)
        assert found.keys() == expected.keys() and len(found) >= 1
        assert np.allclose([found[i] for i in expected], list(expected.values()), rtol=1e-6)
        if chance > 0.5 or threshold > 0.5:  # no draw within its probability, or no token can reach it
            assert found.keys() == kept_by(chain(row, steps[:1])).keys()
    assert len(kept_by(chain(rows(1)[0], [("xtc", 1.0, 0.0005)], 0.99))) < 3000  # it can cut


def mirostat_reference(
    logits: np.ndarray, tau: float, eta: float, mu: float, draw: float
) -> tuple[int, float]:
    """llama.cpp's Mirostat 2.0, a token at a time: the likeliest first, cut at the first whose surprise
    passes `mu` (one at least), renormalised; the token where the running sum passes `draw`; mu's update."""
    ranked = sorted(
        (index for index in range(len(logits)) if logits[index] > LOWEST), key=lambda i: -logits[i]
    )
    top = float(logits[ranked[0]])
    total = sum(math.exp(float(logits[i]) - top) for i in ranked)
    kept = []
    for index in ranked:
        if -math.log2(math.exp(float(logits[index]) - top) / total) > mu:
            break
        kept.append(index)
    kept = kept or ranked[:1]
    mass = sum(math.exp(float(logits[i]) - top) for i in kept)
    running = 0.0
    for index in kept:
        probability = math.exp(float(logits[index]) - top) / mass
        running += probability
        if running > draw:
            break
    return index, mu - eta * (-math.log2(probability) - tau)


@pytest.mark.parametrize("mu", [1.0, 6.0, 9.0, 14.0])
def test_mirostat_picks_and_learns_as_llama_cpps(mu):
    for row in rows(3):
        for draw in (0.0, 0.37, 0.999):
            drawn, learned = mirostat_v2(row, 5.0, 0.1, mu, draw)
            expected, expected_mu = mirostat_reference(row, 5.0, 0.1, mu, draw)
            assert drawn.token == expected and learned == pytest.approx(expected_mu, abs=1e-9)
            p = np.exp(row.astype(np.float64) - row.max()) / np.exp(row.astype(np.float64) - row.max()).sum()
            within = np.flatnonzero(-np.log2(p) <= mu) if (-np.log2(p) <= mu).any() else [np.argmax(p)]
            assert sorted(drawn.ids.tolist()) == sorted(np.asarray(within).tolist())  # what it drew from
            assert np.allclose(drawn.chances, p[drawn.ids] / p[drawn.ids].sum(), rtol=1e-9)
    assert mirostat_v2(rows(1)[0], 5.0, 0.1, 0.0, 0.9)[0].token == int(np.argmax(rows(1)[0]))  # one at least


@pytest.mark.parametrize("spread", [0.3, 0.8, 2.0])
@pytest.mark.parametrize("exponent", [0.5, 1.0, 3.0])
def test_the_dynamic_temperature_follows_the_entropy_as_llama_cpps(spread, exponent):
    for row in rows(4):
        for steps in (
            [("temperature", 0.8, spread, exponent)],
            [("top_k", 40), ("temperature", 1.2, spread, exponent)],
        ):
            found, expected = kept_by(chain(row, steps)), reference(row, steps)
            assert found.keys() == expected.keys()
            assert np.allclose([found[i] for i in expected], list(expected.values()), rtol=1e-5)
            plain = kept_by(chain(row, [*steps[:-1], steps[-1][:2]]))
            assert not np.allclose([found[i] for i in plain], list(plain.values()))  # it changes something


def mirostat_1_kept(logits: np.ndarray, mu: float, m: int = 100) -> tuple[list[int], list[float]]:
    """The tokens llama.cpp's first Mirostat keeps, the likeliest first, with their probabilities: Zipf's
    exponent s from the `m` likeliest (sum t_i b_i / sum t_i^2, t_i = log((i + 2) / (i + 1)), b_i =
    log(p_i / p_(i+1))), then the k = (e 2^mu / (1 - V^-e))^(1/s) likeliest, e = s - 1."""
    ranked = sorted(
        (index for index in range(len(logits)) if logits[index] > LOWEST), key=lambda i: -logits[i]
    )
    top = float(logits[ranked[0]])
    total = sum(math.exp(float(logits[i]) - top) for i in ranked)
    p = [math.exp(float(logits[i]) - top) / total for i in ranked]
    t = [math.log((i + 2) / (i + 1)) for i in range(min(m - 1, len(ranked) - 1))]
    s = sum(ti * math.log(p[i] / p[i + 1]) for i, ti in enumerate(t)) / sum(ti * ti for ti in t)
    k = max(int(((s - 1) * 2**mu / (1 - len(logits) ** (1 - s))) ** (1 / s)), 1)
    return ranked[:k], p[:k]


def mirostat_1_reference(
    logits: np.ndarray, tau: float, eta: float, mu: float, draw: float
) -> tuple[int, float]:
    """llama.cpp's first Mirostat, a token at a time: what it keeps (`mirostat_1_kept`) renormalised, the
    token where the running sum passes `draw`, and mu's update from its surprise."""
    kept, p = mirostat_1_kept(logits, mu)
    mass, running = sum(p), 0.0
    for position in range(len(kept)):
        running += p[position] / mass
        if running > draw:
            break
    return kept[position], mu - eta * (-math.log2(p[position] / mass) - tau)


@pytest.mark.parametrize("mu", [2.0, 6.0, 10.0, 14.0])
def test_the_first_mirostat_picks_and_learns_as_llama_cpps(mu):
    sizes = set()
    for row in rows(3):
        for draw in (0.0, 0.37, 0.999):
            drawn, learned = mirostat_v1(row, 5.0, 0.1, mu, draw)
            expected, expected_mu = mirostat_1_reference(row, 5.0, 0.1, mu, draw)
            assert drawn.token == expected and learned == pytest.approx(expected_mu, rel=1e-6)
            kept, p = mirostat_1_kept(row, mu)  # what it drew from, renormalised
            assert drawn.ids.tolist() == kept and np.allclose(drawn.chances, np.array(p) / sum(p), rtol=1e-9)
            sizes.add(drawn.token)
    assert len(sizes) > 1  # draws pick apart: the comparison can fail


def adaptive_reference(
    logits: np.ndarray, target: float, decay: float, state: tuple[float, float], draw: float
) -> tuple[int, tuple[float, float]]:
    """llama.cpp's adaptive-p, a token at a time: the target adapted by the decayed average so far (2 *
    target - sum / weight, within 0 and 1), each probability's logit 5 - 10 d^2 / (1 + d) with d its
    distance to it over 0.3, the token where the running sum of their softmax passes `draw` (in id
    order), and the state's update with the token's probability before the transform."""
    weighted, total = state
    kept = [index for index in range(len(logits)) if logits[index] > LOWEST]
    top = max(float(logits[i]) for i in kept)
    mass = sum(math.exp(float(logits[i]) - top) for i in kept)
    p = [math.exp(float(logits[i]) - top) / mass for i in kept]
    clamped = min(max(target, 0.0), 1.0)
    adapted = min(max(clamped if total == 0 else 2 * clamped - weighted / total, 0.0), 1.0)
    new = [5 - 10 * (d := abs(q - adapted) / 0.3) ** 2 / (1 + d) for q in p]
    scale = sum(math.exp(value - 5) for value in new)
    running = 0.0
    for position in range(len(new)):
        running += math.exp(new[position] - 5) / scale
        if running > draw:
            break
    return kept[position], (p[position] + decay * weighted, 1 + decay * total)


@pytest.mark.parametrize("target", [0.0, 0.05, 0.5, 2.0])
def test_adaptive_p_picks_and_learns_as_llama_cpps(target):
    picker, picks = ("adaptive_p", target, 0.9), set()
    for row in rows(3, vocab=300):
        tempered = row * 3  # peaked enough that the likeliest reach the targets
        state = first_state(picker)
        assert state == pytest.approx((target / 0.1, 10.0))  # as llama.cpp's reset: the target unclamped
        for draw in (0.0, 0.37, 0.999):
            drawn, learned = pick(picker, tempered, state, draw)
            expected, expected_state = adaptive_reference(tempered, target, 0.9, state, draw)
            assert drawn.token == expected and learned == pytest.approx(expected_state, rel=1e-9)
            state, picks = learned, picks | {drawn.token}
    assert len(picks) > 3 and adaptive_p(rows(1)[0], 0.5, 0.0, 0.0, 0.5)[0].token >= 0


@pytest.mark.parametrize("least", [0, 5, 80])
def test_min_keep_keeps_at_least_that_many_as_llama_cpps_cuts_do(least):
    cuts = [("top_p", 0.3, least), ("min_p", 0.5, least), ("typ_p", 0.2, least), ("xtc", 1.0, 0.001, least)]
    sizes = []
    for row in rows(4):
        for steps in ([step] for step in cuts):
            found, expected = kept_by(chain(row * 3, steps, 0.0)), reference(row * 3, steps, 0.0)
            assert found.keys() == expected.keys(), steps
            sizes.append(len(found))
    assert min(sizes) >= max(least, 1) and (least or min(sizes) < 5)  # without it, some cut below 5


def test_what_a_ban_or_mask_left_out_stays_out_and_one_token_always_stays():
    row = rows(1)[0]
    row[100:] = LOWEST  # banned or masked: only the first 100 in play
    out = chain(row, [("top_k", 400), ("top_p", 0.9), ("temperature", 0.5)])
    assert set(kept_by(out)) <= set(range(100))
    assert len(kept_by(chain(row, [("min_p", 1.0), ("top_p", 0.0)]))) == 1
    assert len(kept_by(chain(row, [("temperature", 0.0)]))) == 1


def test_the_order_matters_so_the_comparison_can_fail():
    """Cutting before the temperature (llama.cpp) keeps more tokens than after it (MAX, vLLM) below 1."""
    row = rows(1)[0]
    cuts_first = kept_by(chain(row, [("top_p", 0.9), ("temperature", 0.5)]))
    temperature_first = kept_by(chain(row, [("temperature", 0.5), ("top_p", 0.9)]))
    assert set(temperature_first) < set(cuts_first)


def test_an_unknown_step_is_named():
    with pytest.raises(ValueError, match="no step 'tfs'"):
        chain(rows(1)[0], [("tfs", 0.5)])
