"""The options of `generate` and `stream`, checked together before any work (`check_options`).

Each refusal names the argument and what it may be. Hugging Face's names:
`min_new_tokens`, `stop_strings` (with the `tokenizer` that spells them),
`pad_token_id`, `num_return_sequences`, `num_beams`, `length_penalty`,
`early_stopping`, and speculative decoding's `prompt_lookup_num_tokens`
(`max_matching_ngram_size`) or `assistant_model` (`num_assistant_tokens`),
made into a `Drafter` (`max_gpt2.inference.drafting`); ours: `context_overflow`, and `constraint`
(`max_gpt2.inference.constraints`: one `Constraint` for every row, or one a prompt, None free).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.inference.constraints import Constraint
from max_gpt2.inference.drafting import AssistantModel, Drafter, PromptLookup
from max_gpt2.inference.prompts import check_generation
from max_gpt2.inference.sampling import Sampler
from max_gpt2.inference.steps import Steps
from max_gpt2.model.config import GPT2Config

OVERFLOWS = ("error", "shift")


@dataclasses.dataclass(frozen=True)
class Options:
    """Checked generation options (see `check_options`)."""

    sampler: Sampler
    max_new_tokens: int
    eos: tuple[int, ...]
    min_new_tokens: int = 0
    stop_strings: tuple[str, ...] = ()
    tokenizer: Tokenizer | None = None
    pad: int | None = None  # what a row holds after it stops on a stop string
    num_return_sequences: int = 1
    shift: bool = False  # context_overflow="shift"
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    drafter: Drafter | None = None  # speculative decoding: what drafts the tokens to check
    constraint: Constraint | tuple[Constraint | None, ...] | None = None  # every row's, or a prompt's


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
    return int(value)


def check_options(
    config: GPT2Config,
    max_new_tokens: Any,
    sampler: Sampler | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    min_new_tokens: int = 0,
    stop_strings: str | Sequence[str] | None = None,
    tokenizer: Tokenizer | None = None,
    pad_token_id: int | None = None,
    num_return_sequences: int = 1,
    context_overflow: str = "error",
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    prompt_lookup_num_tokens: int | None = None,
    max_matching_ngram_size: int = 2,
    assistant_model: Steps | None = None,
    num_assistant_tokens: int = 8,
    constraint: Constraint | Sequence[Constraint | None] | None = None,
) -> Options:
    """The options checked against `config`; ValueError or TypeError naming the first that is wrong."""
    sampler = Sampler() if sampler is None else sampler
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a Sampler, got {type(sampler).__name__}")
    sampler.check_vocabulary(config.vocab_size)
    eos = check_generation(config, max_new_tokens, eos_token_id)
    min_new = _count("min_new_tokens", min_new_tokens, 0)
    returned = _count("num_return_sequences", num_return_sequences, 1)
    beams = _count("num_beams", num_beams, 1)
    stops = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings or ())
    if not all(isinstance(stop, str) and stop for stop in stops):
        raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
    if stops and not isinstance(tokenizer, Tokenizer):
        raise ValueError("stop_strings needs the tokenizer that spells the tokens: pass tokenizer=")
    if pad_token_id is not None and (
        isinstance(pad_token_id, bool)
        or not isinstance(pad_token_id, (int, np.integer))
        or not 0 <= pad_token_id < config.vocab_size
    ):
        raise ValueError(
            f"pad_token_id must be a token id in 0..{config.vocab_size - 1}, got {pad_token_id!r}"
        )
    if context_overflow not in OVERFLOWS:
        raise ValueError(f"context_overflow must be one of {OVERFLOWS}, got {context_overflow!r}")
    if beams == 1 and returned > 1 and not sampler.do_sample:
        raise ValueError(
            f"num_return_sequences={returned} of greedy decoding would be {returned} copies: "
            "sample (Sampler(do_sample=True)) or search with num_beams >= num_return_sequences"
        )
    if beams > 1:
        _check_beams(sampler, beams, returned, stops, context_overflow, length_penalty, early_stopping)
    elif length_penalty != 1.0 or early_stopping is not False:  # Hugging Face warns the same
        warnings.warn("num_beams is 1: length_penalty and early_stopping change nothing", stacklevel=4)
    if min_new > int(max_new_tokens):
        warnings.warn(
            f"min_new_tokens={min_new} > max_new_tokens={max_new_tokens}: it stops at the latter",
            stacklevel=4,
        )
    drafter = _drafter(
        config, prompt_lookup_num_tokens, max_matching_ngram_size, assistant_model, num_assistant_tokens
    )
    if drafter is not None and (beams > 1 or context_overflow != "error"):
        raise ValueError(
            "speculative decoding (prompt_lookup_num_tokens, assistant_model) takes neither num_beams > 1 "
            "nor context_overflow='shift'"
        )
    constraint = _constraint(constraint, tokenizer, min_new, beams)
    if constraint is not None and not eos:  # a complete text ends on end-of-text: the model's own
        eos = config.stop_token_ids
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else None)
    return Options(
        sampler, int(max_new_tokens), eos, min_new, stops, tokenizer, pad, returned,
        context_overflow == "shift", beams, float(length_penalty), early_stopping, drafter, constraint,
    )  # fmt: skip


OPTIONS = tuple(inspect.signature(check_options).parameters)[2:]
"""The options `generate` and `stream` take, by name (`check_options`'s after the config and length)."""


def _constraint(
    constraint: Any, tokenizer: Tokenizer | None, min_new: int, beams: int
) -> Constraint | tuple[Constraint | None, ...] | None:
    """`constraint` checked: one `Constraint`, or a sequence of them (None: a free prompt), or None."""
    if constraint is None or isinstance(constraint, Constraint):
        given = constraint
    elif isinstance(constraint, Sequence) and not isinstance(constraint, str):
        given = tuple(constraint)
        if not given or not all(c is None or isinstance(c, Constraint) for c in given):
            raise TypeError(
                f"constraint must be a Constraint or a list of them (None: free); got {constraint!r}"
            )
    else:
        raise TypeError(f"constraint must be a Constraint or a list of them, got {type(constraint).__name__}")
    if given is None:
        return None
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError("constraint needs the tokenizer whose tokens spell the text: pass tokenizer=")
    if min_new:
        raise ValueError("constraint ends a row once its text is complete, which min_new_tokens would forbid")
    if beams > 1:
        raise ValueError("constraint does not take num_beams > 1: beams reordered would each need a matcher")
    return given


def _drafter(
    config: GPT2Config, lookup: Any, ngram: Any, assistant: Any, assistant_tokens: Any
) -> Drafter | None:
    """The drafter the speculative decoding options ask for, or None."""
    ngram, assistant_tokens = (
        _count("max_matching_ngram_size", ngram, 1),
        _count("num_assistant_tokens", assistant_tokens, 1),
    )
    if lookup is not None and assistant is not None:
        raise ValueError("give prompt_lookup_num_tokens or assistant_model, not both")
    if lookup is not None:
        return PromptLookup(_count("prompt_lookup_num_tokens", lookup, 1), ngram)
    if assistant is None:
        return None
    if not all(callable(getattr(assistant, step, None)) for step in ("new_cache", "prefill", "extend")):
        raise TypeError(f"assistant_model must be a compiled language model, got {type(assistant).__name__}")
    if assistant.config.vocab_size != config.vocab_size:
        raise ValueError(
            f"assistant_model's vocabulary has {assistant.config.vocab_size} tokens, the model's "
            f"{config.vocab_size}: drafts must be the model's own tokens"
        )
    return AssistantModel(assistant, assistant_tokens)


def _check_beams(
    sampler: Sampler,
    beams: int,
    returned: int,
    stops: tuple[str, ...],
    context_overflow: str,
    length_penalty: Any,
    early_stopping: Any,
) -> None:
    """What beam search takes: a greedy sampler, at most `beams` sequences back, no stop strings or shift."""
    if sampler.do_sample:
        raise ValueError("num_beams > 1 searches the most likely sequences: give a greedy Sampler")
    if returned > beams:
        raise ValueError(f"num_return_sequences must be at most num_beams={beams}, got {returned}")
    if stops or context_overflow != "error":
        raise ValueError("num_beams > 1 takes neither stop_strings nor context_overflow='shift'")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
