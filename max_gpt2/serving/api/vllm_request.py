"""vLLM's own request fields on the OpenAI routes, declared as its `CompletionRequest` and
`ChatCompletionRequest` declare them: `VllmFields` on both routes, `VllmChatFields` on chat alone.

What each value may be and what it does is checked after (`max_gpt2.serving.api.vllm_fields`). vLLM's
fields that change nothing here are in `NO_EFFECT`, those refused whenever set in `REFUSED` (with the
values in `HARMLESS` that ask for what is done anyway): each with why, which the refusal and
docs/serving.md repeat; `max_gpt2.serving.api.protocol` merges them with OpenAI's and MAX's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CACHE_SALT_MAX = 512  # characters of a `cache_salt`, as MAX's and vLLM's schemas allow

NO_EFFECT: dict[str, tuple[Any, str]] = {
    "spaces_between_special_tokens": (bool, "GPT-2's fast tokenizer writes none either way, as vLLM's"),
    "add_special_tokens": (bool, "GPT-2's tokenizer has no special token (no BOS) to add"),
    "session_id": (str, "vLLM's routers keep a session's requests together by it; this is one server"),
    "include_reasoning": (bool, "GPT-2 writes no reasoning to include"),
    "return_token_offsets": (
        bool,
        "vLLM fills offsets on its render routes alone",
    ),
}
REFUSED = {
    "guided_whitespace_pattern": "xgrammar, which holds a text to its constraint here, takes no pattern",
    "early_stopping": "vLLM's older beam search took it; its beam search here runs to max_tokens, as vLLM's",
    "thinking_token_budget": "GPT-2 does not reason (vLLM refuses a budget too without a reasoning parser)",
    "kv_transfer_params": "disaggregated serving is not used here",
    "ec_transfer_params": "disaggregated serving is not used here",
    "vllm_xargs": "no extension (logits processor or plugin) runs here to read them",
    "logits_processors": "none run here (vLLM's run only where started with --logits-processor-pattern)",
    "chat_template": "the served template is the model's or --chat-template's: vLLM too refuses a request's "
    "own template unless started with --trust-request-chat-template",
    "mm_processor_kwargs": "GPT-2 reads text alone",
    "media_io_kwargs": "GPT-2 reads text alone",
}
HARMLESS: dict[str, tuple[Any, ...]] = {"thinking_token_budget": (-1,)}  # -1: no budget, as vLLM reads it


class RepetitionDetection(BaseModel):
    """vLLM's `repetition_detection`: a choice ends ("repetition") once its last tokens are a pattern of
    `min_pattern_size` to `max_pattern_size` tokens (0: 1) repeated `min_count` times
    (`max_gpt2.serving.api.repetition`)."""

    model_config = ConfigDict(extra="forbid")
    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class VllmFields(BaseModel):
    """vLLM's fields that completions and chat completions share (`vllm_fields` says what each does)."""

    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    return_token_ids: bool | None = False
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX)
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    use_beam_search: bool = False  # with `n` beams (`max_gpt2.serving.api.beams`)
    length_penalty: float = 1.0
    return_tokens_as_token_ids: bool | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    stream_interval: int | None = None
    priority: int = 0
    request_id: str | None = None
    repetition_detection: RepetitionDetection | None = None


class VllmChatFields(BaseModel):
    """vLLM's fields of chat completions alone: how the template renders the messages, and `echo`."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None  # passed to the template, as `chat_template_kwargs`
    echo: bool = False  # the last message's content before the answer's, where their roles match
    return_prompt_text: bool | None = None  # the rendered prompt's text beside the answer
