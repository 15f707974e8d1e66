"""vLLM's `repetition_detection` rule (`max_gpt2.serving.api.repetition`) against its definition, written
another way: a text repeats where its last `size * count` tokens are its last `size` tokens `count` times
over, for a size in range. Through the server: tests/test_serve_vllm_fields.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import requires_serving

pytestmark = requires_serving()


def repeats(ids: list[int], low: int, high: int, count: int) -> bool:
    return any(
        size * count <= len(ids) and ids[len(ids) - size * count :] == ids[len(ids) - size :] * count
        for size in range(low, high + 1)
    )


@settings(deadline=None)  # the first example imports the serving package
@given(
    st.lists(st.integers(0, 2), max_size=24),
    st.integers(1, 5),
    st.integers(0, 4),
    st.integers(2, 4),
)
def test_a_pattern_is_found_where_the_tail_repeats_it(ids, low, more, count):
    from max_gpt2.serving.api.repetition import Repetition

    assert Repetition(low, low + more, count).found(ids) == repeats(ids, low, low + more, count)


def test_only_sizes_in_range_and_only_the_tail_count():
    from max_gpt2.serving.api.repetition import Repetition

    assert Repetition(1, 4, 3).found([5, 7, 9, 7, 9, 7, 9])
    assert not Repetition(1, 4, 3).found([5, 7, 9, 7, 9])  # twice
    assert not Repetition(3, 4, 3).found([5, 7, 9, 7, 9, 7, 9])  # (7, 9) is shorter than 3
    assert not Repetition(1, 2, 2).found([4, 4, 4, 5])  # the repeats are not at the end
    assert Repetition(1, 1, 2).found([4, 5, 5])
