"""Generating tokens from a compiled language model: the prefill, then one decoding step per token.

    for step in lm.stream(input_ids, 20, sampler=Sampler(do_sample=True, top_k=40, seed=1)):
        step.tokens                                    # int64 [batch], chosen from step.logits [batch, vocab]
    out = lm.generate(input_ids, 20)                   # int64 [batch, seq + 20], greedy

`stream` and `generate` are `CompiledLM`'s methods, written here on its public
steps (`new_cache`, `prefill`, `decode_step`), as gpt-fast has it: the prompt runs
once into a cache sized for prompt plus new tokens, then each step feeds the
tokens just chosen. How tokens are chosen is one `Sampler` (greedy by default);
`eos_token_id` ends rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np

from max_gpt2.inference.prompts import check_generation, check_prompt
from max_gpt2.inference.sampling import Sampler

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from max_gpt2.inference.lm import CompiledLM


class Step(NamedTuple):
    """One generated token per row, and the logits it was chosen from."""

    tokens: np.ndarray  # int64 [batch]
    logits: np.ndarray  # float32 [batch, vocab]


def stream(
    lm: CompiledLM,
    input_ids: Any,
    max_new_tokens: int,
    attention_mask: Any = None,
    sampler: Sampler | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> Iterator[Step]:
    """Yields each `Step` as soon as it is chosen.

    Every argument is checked here, before the first step runs. Greedy unless
    `sampler` samples; the same sampler (and seed) gives the same tokens.
    `eos_token_id` is one id or several: a row that produces one of them
    produces that one from then on; the iteration ends after `max_new_tokens`
    steps, or earlier once every row has.
    """
    sampler = Sampler() if sampler is None else sampler
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a Sampler, got {type(sampler).__name__}")
    eos = check_generation(lm.config, max_new_tokens, eos_token_id)
    ids, mask = check_prompt(lm.config, input_ids, attention_mask, int(max_new_tokens))
    return _steps(lm, ids, mask, int(max_new_tokens), sampler, eos)


def _steps(
    lm: CompiledLM,
    ids: np.ndarray,
    mask: np.ndarray,
    max_new_tokens: int,
    sampler: Sampler,
    eos: tuple[int, ...],
) -> Iterator[Step]:
    batch, seq_len = ids.shape
    cache = lm.new_cache(batch, seq_len + max_new_tokens)
    logits = lm.prefill(ids, cache, mask)
    rng = sampler.generator()
    # A few microseconds a NumPy call add up against a batch-1 step of a few milliseconds: without
    # end-of-text ids there is nothing to track, and `np.isin` costs ten times a comparison.
    stop_ids = np.array(eos, dtype=np.int64)
    ended_with = np.full(batch, -1)  # the end-of-text id each finished row produced; -1: not finished
    for step in range(max_new_tokens):
        tokens = sampler(logits, rng)
        if eos:
            tokens = np.where(ended_with >= 0, ended_with, tokens)
            stopped = (tokens[:, None] == stop_ids).any(axis=1)
            ended_with = np.where((ended_with < 0) & stopped, tokens, ended_with)
        yield Step(tokens, logits)
        if step == max_new_tokens - 1 or (eos and (ended_with >= 0).all()):
            return
        logits = lm.decode_step(tokens, cache)


class GenerationOptions(TypedDict, total=False):
    """`stream`'s options after the attention mask, which `generate` passes on."""

    sampler: Sampler | None
    eos_token_id: int | Sequence[int] | None


def generate(
    lm: CompiledLM,
    input_ids: Any,
    max_new_tokens: int,
    attention_mask: Any = None,
    **options: Unpack[GenerationOptions],
) -> np.ndarray:
    """The prompt followed by `max_new_tokens` new tokens per row, int64 `[batch, seq + new]`.

    As `stream`, all at once; once every row has produced `eos_token_id`, the
    rest is filled with it without running the model.
    """
    steps = list(lm.stream(input_ids, max_new_tokens, attention_mask, **options))
    new = np.stack([step.tokens for step in steps], axis=1)  # [batch, steps run]
    # Fewer steps than asked: every row ended, so the last step is end-of-text throughout.
    rest = np.repeat(new[:, -1:], max_new_tokens - new.shape[1], axis=1)
    return np.concatenate([np.asarray(input_ids, dtype=np.int64), new, rest], axis=1)
