"""Generating tokens from a compiled language model: the prefill, then one decoding step per token.

    for step in lm.stream(input_ids, 20, sampler=Sampler(do_sample=True, top_k=40, seed=1)):
        step.tokens                                    # int64 [batch], chosen from step.logits [batch, vocab]
    out = lm.generate(input_ids, 20, prompt_lookup_num_tokens=10)  # speculative (`drafting`): the same
    out = lm.generate(input_ids, 20)                   # int64 [batch, seq + 20], greedy
    out = lm.generate(input_ids, 20, num_beams=4)      # beam search (`max_gpt2.inference.beam_search`)

`stream` and `generate` are `Steps`'s methods, written here on its public
steps (`new_cache`, `prefill`, `decode_step`), as gpt-fast has it: the prompt runs
once into a cache sized for prompt plus new tokens, then each step feeds the
tokens just chosen. How tokens are chosen is one `Sampler` (greedy by default),
its logits controls included; `eos_token_id` and `stop_strings` end rows,
`min_new_tokens` bans end-of-text until then, `num_return_sequences` runs each
prompt several times in one batch, and `context_overflow="shift"` goes on past
`n_positions` (`max_gpt2.inference.context_shift`), and `constraint` holds rows to a JSON schema,
a pattern, choices or a grammar (`max_gpt2.inference.constraints`). The options are checked in
`max_gpt2.inference.generation_options`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.inference.beam_search import beam_search
from max_gpt2.inference.constraints import Constraint, Guide
from max_gpt2.inference.context_shift import kept_tail
from max_gpt2.inference.drafting import DraftCounts, Speculation
from max_gpt2.inference.generation_options import OPTIONS, Options, check_options
from max_gpt2.inference.logit_controls import ban
from max_gpt2.inference.prompts import check_left_padding, check_prompt
from max_gpt2.inference.sampling import Sampler
from max_gpt2.inference.steps import Steps
from max_gpt2.inference.stop_strings import StopStrings

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Step(NamedTuple):
    """One generated token per row, and the model's logits it was chosen from (before the controls)."""

    tokens: np.ndarray  # int64 [batch]
    logits: np.ndarray  # float32 [batch, vocab]


class Stream(Iterator[Step]):
    """`stream`'s steps as they come, and with speculative decoding how many tokens were drafted and
    how many of them accepted so far (`drafts`, `max_gpt2.inference.drafting`)."""

    def __init__(self, steps: Iterator[Step], drafts: DraftCounts) -> None:
        self.steps, self.drafts = steps, drafts

    def __next__(self) -> Step:
        return next(self.steps)


class StreamOptions(TypedDict, total=False):
    """`stream`'s options after the attention mask (`generation_options.check_options` checks them)."""

    sampler: Sampler | None
    eos_token_id: int | Sequence[int] | None
    min_new_tokens: int
    stop_strings: str | Sequence[str] | None
    tokenizer: Tokenizer | None
    pad_token_id: int | None
    num_return_sequences: int
    context_overflow: str
    prompt_lookup_num_tokens: int | None
    max_matching_ngram_size: int
    assistant_model: Steps | None
    num_assistant_tokens: int
    constraint: Constraint | Sequence[Constraint | None] | None


class GenerationOptions(StreamOptions, total=False):
    """`generate`'s: `stream`'s, and beam search's."""

    num_beams: int
    length_penalty: float
    early_stopping: bool | str


def stream(
    lm: Steps,
    input_ids: Any,
    max_new_tokens: int,
    attention_mask: Any = None,
    **options: Unpack[StreamOptions],
) -> Stream:
    """Yields each `Step` as soon as it is chosen.

    Every argument is checked here, before the first step runs. Greedy unless
    `sampler` samples; the same sampler (and seed) gives the same tokens.
    `eos_token_id` is one id or several: a row that produces one of them
    produces that one from then on. A row whose generated text comes to hold one
    of `stop_strings` (spelled by `tokenizer`, `lm.tokenizer` by default) produces
    `pad_token_id` from then on (default: the first end-of-text id). The
    iteration ends after `max_new_tokens` steps, or earlier once every row has
    ended. With `num_return_sequences` n, each prompt's row is repeated n times,
    together, in one batch of batch x n rows.
    """
    checked, drafts = _checked(lm, max_new_tokens, options), DraftCounts()
    ids, mask = _prompts(lm, input_ids, attention_mask, checked)
    guide = _guide(lm, checked, ids.shape[0])
    return Stream(_steps(lm, ids, mask, checked, drafts, guide), drafts)


def _checked(lm: Steps, max_new_tokens: int, options: dict[str, Any]) -> Options:
    if unknown := sorted(options.keys() - set(OPTIONS)):
        hint = (
            " (max_new_tokens, the second argument, counts the tokens added)"
            if "max_length" in unknown
            else ""
        )
        raise TypeError(
            f"generation takes no option {', '.join(unknown)}{hint}; it takes {', '.join(OPTIONS)}"
        )
    tokenizer = options.pop("tokenizer", None) or lm.tokenizer
    return check_options(lm.config, max_new_tokens, tokenizer=tokenizer, **options)


def _prompts(
    lm: Steps, input_ids: Any, attention_mask: Any, options: Options
) -> tuple[np.ndarray, np.ndarray]:
    """The prompts checked, each row repeated `num_return_sequences` times (beam search repeats its own)."""
    new_tokens = 0 if options.shift else options.max_new_tokens
    ids, mask = check_prompt(lm.config, input_ids, attention_mask, new_tokens)
    check_left_padding(mask)
    repeats = options.num_return_sequences if options.num_beams == 1 else 1
    ids, mask = np.repeat(ids, repeats, axis=0), np.repeat(mask, repeats, axis=0)
    if options.drafter is not None:
        if ids.shape[0] > 1:
            raise ValueError(
                "speculative decoding drafts for one sequence at a time (batch 1, num_return_sequences 1); "
                f"got {ids.shape[0]} rows"
            )
        options.drafter.check(min(ids.shape[1] + options.max_new_tokens, lm.config.n_positions))
    if options.stop_strings and options.pad is None and ids.shape[0] > 1:
        raise ValueError(
            "stop_strings with several rows needs pad_token_id (or eos_token_id): what a row holds "
            "once it stops"
        )
    return ids, mask


def _guide(lm: Steps, options: Options, rows: int) -> Guide | None:
    """The constrained rows' guide, each prompt's constraint repeated for its `num_return_sequences`
    rows; refused where a list of constraints is not one a prompt."""
    constraint, repeats = options.constraint, options.num_return_sequences
    if constraint is None:
        return None
    per_prompt = constraint if isinstance(constraint, tuple) else (constraint,) * (rows // repeats)
    if len(per_prompt) * repeats != rows:
        raise ValueError(f"constraint: one a prompt, for {rows // repeats} prompts; got {len(per_prompt)}")
    assert options.tokenizer is not None  # `check_options` refuses a constraint without one
    engine = lm.grammars.engine(options.tokenizer, options.eos)
    return engine.guide([c for c in per_prompt for _ in range(repeats)])


def _steps(
    lm: Steps,
    ids: np.ndarray,
    mask: np.ndarray,
    options: Options,
    drafts: DraftCounts | None = None,
    guide: Guide | None = None,
) -> Iterator[Step]:
    sampler, eos, steps, drafter = options.sampler, options.eos, options.max_new_tokens, options.drafter
    batch, seq_len = ids.shape
    positions = lm.config.n_positions
    cache = lm.new_cache(batch, min(seq_len + steps, positions))
    logits = lm.prefill(ids, cache, mask)
    if drafter is not None:  # one row (`_prompts`)
        drafter.start(ids, mask, cache.capacity)
        speculation = Speculation(drafter, ids[mask == 1], cache.capacity, drafts or DraftCounts())
    rng = sampler.generator()
    history = sampler.history(ids, mask, lm.config.vocab_size)
    stops = StopStrings(options.stop_strings, options.tokenizer, batch) if options.stop_strings else None
    # A few microseconds a NumPy call add up against a batch-1 step of a few milliseconds: without
    # end-of-text ids or stop strings there is nothing to track, and `np.isin` costs ten times a comparison.
    stop_ids = np.array(eos, dtype=np.int64)
    finished, fill = np.zeros(batch, dtype=bool), np.zeros(batch, dtype=np.int64)
    generated: list[np.ndarray] = []  # since the last shift, for the next one
    for step in range(steps):
        scores = sampler.controlled(logits, history)
        if step < options.min_new_tokens and eos:
            scores = ban(scores, eos)
        if guide is not None:
            scores = guide.mask(scores, finished)
        tokens = sampler(scores, rng)
        if guide is not None:
            guide.accept(tokens, finished)
        if eos or stops:
            tokens = np.where(finished, fill, tokens)
            hit_eos = ~finished & (tokens[:, None] == stop_ids).any(axis=1)
            hit_stop = ~finished & stops.update(tokens) if stops else np.zeros(batch, dtype=bool)
            fill = np.where(hit_eos, tokens, np.where(hit_stop, options.pad or 0, fill))
            finished |= hit_eos | hit_stop
        if history is not None:
            history.append(tokens)
        if drafter is not None:  # the logits after the token, where it was drafted and run already
            drafted = speculation.take(int(tokens[0]), cache)
        yield Step(tokens, logits)
        if step == steps - 1 or finished.all():
            return
        if options.shift:
            generated.append(tokens)
        if drafter is not None:
            logits = drafted if drafted is not None else speculation.run(lm, cache, steps - step - 1)
            continue
        if cache.length < cache.capacity:
            logits = lm.decode_step(tokens, cache)
            continue
        # Only with context_overflow="shift": the cache is full and tokens remain.
        ids, mask = kept_tail(ids, mask, np.stack(generated, axis=1), cache.capacity // 2)
        generated = []
        cache = lm.new_cache(batch, min(ids.shape[1] + steps - step - 1, positions))
        logits = lm.prefill(ids, cache, mask)


def generate(
    lm: Steps,
    input_ids: Any,
    max_new_tokens: int,
    attention_mask: Any = None,
    **options: Unpack[GenerationOptions],
) -> np.ndarray:
    """The prompt followed by `max_new_tokens` new tokens per row, int64 `[batch x n, seq + new]` (n:
    `num_return_sequences`, each prompt's rows together).

    As `stream`, all at once; once every row has produced `eos_token_id`, the
    rest is filled with it without running the model. With `stop_strings` the
    ids end with the step at which the last row stopped. With `num_beams` > 1,
    Hugging Face's beam search (`max_gpt2.inference.beam_search`): its
    `num_return_sequences` best sequences per prompt, as long as the longest.
    """
    checked = _checked(lm, max_new_tokens, dict(options))
    ids, mask = _prompts(lm, input_ids, attention_mask, checked)
    if checked.num_beams > 1:
        return beam_search(lm, ids, mask, checked)
    steps = _steps(lm, ids, mask, checked, guide=_guide(lm, checked, ids.shape[0]))
    new = np.stack([step.tokens for step in steps], axis=1)  # [rows, steps run]
    if checked.stop_strings:
        return np.concatenate([ids, new], axis=1)
    # Fewer steps than asked: every row ended, so the last step is end-of-text throughout.
    rest = np.repeat(new[:, -1:], max_new_tokens - new.shape[1], axis=1)
    return np.concatenate([ids, new, rest], axis=1)
