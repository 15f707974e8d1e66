"""vLLM's beam search (`max_gpt2.serving.api.beams.best_beams`) against an exhaustive search: where the
beams are wide enough that none is ever dropped, the best are the best of every sequence the model could
end (at end-of-text, or at the last step), each scored as vLLM scores it, its log-probabilities' sum over
its length, prompt included and end-of-text not, to the length penalty."""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest

from max_gpt2.serving.api.beams import best_beams

VOCAB, EOS, PROMPT = 4, 3, [0, 1]


def table(seed: int):
    """A made-up model: the log-probabilities of the next token after a sequence, from its last two."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(VOCAB, VOCAB, VOCAB)) * 2
    return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def exhaustive(logs, most: int, width: int, keep: bool, penalty: float) -> list[tuple[list[int], float]]:
    """Every sequence ended at end-of-text or after `most` tokens, its score, the `width` best."""
    ended = []
    for length in range(1, most + 1):
        for tokens in itertools.product(range(VOCAB), repeat=length):
            if EOS in tokens[:-1] or (length < most and tokens[-1] != EOS):
                continue
            ids, total = list(PROMPT), 0.0
            for token in tokens:
                total += logs[ids[-2], ids[-1], token]
                ids.append(token)
            shown = list(tokens) if keep or tokens[-1] != EOS else list(tokens[:-1])
            size = len(PROMPT) + len(shown) - (1 if shown and shown[-1] == EOS else 0)
            ended.append((shown, total / max(size, 1) ** penalty))
    return sorted(ended, key=lambda pair: -pair[1])[:width]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("keep", "penalty"), [(False, 1.0), (True, 0.5), (False, 2.0)])
def test_wide_beams_find_the_best_of_every_ending(seed, keep, penalty):
    logs = table(seed)

    async def tops(sequences):
        return [
            dict(sorted(((t, float(logs[s[-2], s[-1], t])) for t in range(VOCAB)), key=lambda p: -p[1]))
            for s in sequences
        ]

    most, width = 3, 40  # at most 3^3 live sequences: none dropped
    beams = asyncio.run(best_beams(PROMPT, tops, width, most, ({EOS}, False, keep), penalty))
    expected = exhaustive(logs, most, width, keep, penalty)
    assert [[token.id for token in beam.tokens] for beam in beams] == [tokens for tokens, _ in expected]
    for beam, (_, score) in zip(beams, expected, strict=True):
        size = len(PROMPT) + len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1].id == EOS else 0)
        assert beam.logprob / size**penalty == pytest.approx(score, rel=1e-12)
        assert (beam.finish.reason == "stop") == (beam.finish.stop_reason == EOS)
    assert any(beam.finish.reason == "stop" for beam in beams) and not math.isnan(beams[0].logprob)
