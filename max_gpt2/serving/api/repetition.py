"""vLLM's `repetition_detection`: a choice ends once its tokens end in a pattern repeated enough times.

    rule = Repetition(min_size=1, max_size=4, count=3)
    rule.found([5, 7, 9, 7, 9, 7, 9])   # True: (7, 9) three times over
    rule.found([5, 7, 9, 7, 9])         # False: twice

Only the tokens a choice made count, not its prompt's, and none before `min_tokens` have come
(`choices.Choice`); the choice then ends with `finish_reason` "repetition" and `stop_reason`
"repetition_detected", as vLLM's scheduler ends it. A stop string, a stop token or the length that
ends the choice at the same token ends it first, as there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from max_gpt2.serving.api.protocol import Refusal
from max_gpt2.serving.api.vllm_request import RepetitionDetection


@dataclass(frozen=True)
class Repetition:
    """Patterns of `min_size` to `max_size` tokens, each repeated `count` times at the end of a text."""

    min_size: int
    max_size: int
    count: int

    def found(self, ids: Sequence[int]) -> bool:
        """Whether `ids` end in a pattern of a size in range repeated `count` times."""
        end = len(ids)
        for size in range(self.min_size, self.max_size + 1):
            if size * self.count > end:
                return False
            last = ids[end - size :]
            if all(ids[end - size * (k + 1) : end - size * k] == last for k in range(1, self.count)):
                return True
        return False


def repetition_of(asked: RepetitionDetection | None) -> Repetition | None:
    """The rule `repetition_detection` asks for, None where it asks for none (`max_pattern_size` 0, as
    vLLM reads it); a `Refusal` for sizes out of order or a count below 2, as vLLM refuses them."""
    if asked is None:
        return None
    low, high, count = asked.min_pattern_size, asked.max_pattern_size, asked.min_count
    if low < 0 or high < 0 or low > high:
        raise Refusal(
            "repetition_detection",
            "repetition_detection: min_pattern_size and max_pattern_size 0 or more, the min at most the "
            f"max (0 and 0: no detection); got {low} and {high}",
        )
    if high == 0:
        return None
    if count < 2:
        raise Refusal(
            "repetition_detection",
            f"repetition_detection.min_count: at least 2 repeats of a pattern to find; got {count}",
        )
    return Repetition(max(low, 1), high, count)
