"""DRY (`max_gpt2.inference.dry`) against a reference written here from its definition in llama.cpp's
`src/llama-sampler.cpp`: for each earlier place in the window, how long the tokens before it repeat the
window's last ones (a plain search, where ours runs the Z-algorithm), bounded by the latest breaker;
and its breakers found in a trained vocabulary by each of their beginnings (where ours reads each
token's endings)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from max_gpt2.inference.dry import MOST_TAIL, Heads, breaker_heads, penalties
from max_gpt2.inference.sampler_chain import chain
from max_gpt2.inference.tokenizer import token_bytes
from max_gpt2.testing import write_tokenizer


def reference(
    history: list[int], multiplier: float, base: float, allowed: int, last_n: int, heads: Heads
) -> dict[int, float]:
    """What each token's logit loses: a token that followed an earlier copy of the window's last L tokens
    (L at least `allowed`, and within the tokens after the latest breaker) loses multiplier * base **
    (L - allowed), its longest L counted, unless it is a breaker alone."""
    window = history[-last_n:] if last_n > 0 else []
    if multiplier == 0 or base < 1 or len(window) <= allowed:
        return {}
    limit = len(window)
    for start in range(len(window) - 1, -1, -1):  # the breaker that starts latest, its longest ending
        endings = [tail for tail in heads.get(window[start], ()) if start + len(tail) < len(window)]
        found = [tail for tail in endings if tuple(window[start + 1 : start + 1 + len(tail)]) == tail]
        if found:
            limit = len(window) - 1 - (start + max(map(len, found)))
            break
    if limit < allowed:
        return {}
    longest: dict[int, int] = {}
    for place in range(1, len(window)):
        length = 0
        while length < place and window[place - 1 - length] == window[-1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            longest[window[place]] = max(longest.get(window[place], 0), length)
    cap = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    return {
        token: multiplier * base ** (min(length - allowed, cap) if cap else length - allowed)
        for token, length in longest.items()
        if () not in heads.get(token, ())
    }


def test_llama_cpps_own_example():
    """`a b c c b c y a b c`: a `c` would make `a b c` a run of 4, a `b` `c` a run of 2, a `y` `b c` 3."""
    a, b, c, y = 1, 2, 3, 9
    lost = penalties([a, b, c, c, b, c, y, a, b, c], 1.0, 2.0, 1, 64, {})
    assert lost == {c: 4.0, b: 1.0, y: 2.0} == reference([a, b, c, c, b, c, y, a, b, c], 1.0, 2.0, 1, 64, {})


HEADS = st.dictionaries(
    st.integers(0, 3), st.lists(st.lists(st.integers(0, 3), max_size=2).map(tuple), min_size=1, max_size=2)
).map(lambda heads: {token: tuple(dict.fromkeys(tails)) for token, tails in heads.items()})


@settings(max_examples=400, deadline=None)
@given(
    history=st.lists(st.integers(0, 3), max_size=60),
    base=st.sampled_from([1.0, 1.5, 1.75, 3.0, 1e10]),
    allowed=st.integers(0, 4),
    last_n=st.integers(0, 70),
    heads=HEADS,
)
def test_penalties_equal_the_plain_search(history, base, allowed, last_n, heads):
    found, expected = (
        penalties(history, 0.8, base, allowed, last_n, heads),
        reference(history, 0.8, base, allowed, last_n, heads),
    )
    assert found.keys() == expected.keys()
    assert all(math.isclose(found[token], expected[token], rel_tol=1e-12) for token in found)


def test_the_chain_subtracts_them_from_what_it_keeps_in_its_order():
    history = [5, 6, 7, 5, 6]  # a 7 would make `5 6` a run of 3, at the allowed length 2: 2.0 * 1.75**0
    row = np.linspace(0.9, 0.0, 10, dtype=np.float32)  # 9 the least likely
    alone = chain(row, [("dry", 2.0, 1.75, 2, 64)], history=history)
    assert alone[7] == np.float32(row[7] - 2.0) and np.array_equal(np.delete(alone, 7), np.delete(row, 7))
    first = chain(row, [("dry", 2.0, 1.75, 2, 64), ("top_k", 9)], history=history)
    after = chain(row, [("top_k", 9), ("dry", 2.0, 1.75, 2, 64)], history=history)
    assert first[7] < -1e30 < first[9] and after[9] < -1e30 < after[7] == alone[7]


def test_breakers_are_found_by_each_of_their_beginnings(tmp_path):
    """A token that holds a breaker is a breaker alone; a token that ends with the breaker's first j bytes
    (and does not hold it) begins it, followed by the ids of the rest (at most 20)."""
    tokenizer = write_tokenizer(tmp_path, 1000)
    pieces = [token_bytes(tokenizer, i) for i in range(tokenizer.get_vocab_size())]

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    breakers = ["\n", ":", " the attention heads of every layer in turn", "é"]
    heads = breaker_heads(breakers, pieces, encode)
    expected: dict[int, set[tuple[int, ...]]] = {}
    for breaker in (each.encode("utf-8")[:40] for each in breakers):
        for token, piece in enumerate(pieces):
            if breaker in piece:
                expected.setdefault(token, set()).add(())
                continue
            for j in range(1, len(breaker)):
                if piece.endswith(breaker[:j]):
                    try:
                        rest = breaker[j:].decode("utf-8")
                    except UnicodeDecodeError:  # a character's bytes cut: no text to tokenize
                        continue
                    expected.setdefault(token, set()).add(tuple(encode(rest)[:MOST_TAIL]))
    assert {token: set(tails) for token, tails in heads.items()} == expected
    assert any(len(tail) > 1 for tails in heads.values() for tail in tails)  # breakers of several tokens
    assert all(() in heads[token] for text in ("\n", ":") for token in encode(text))
