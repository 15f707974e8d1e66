"""The request bodies the server reads, as typed models: OpenAI's fields, vLLM's and MAX's extensions.

Each route validates its body here first (`parse`): a field of the wrong type, or one no model here
knows, is a `Refusal` naming it, as OpenAI answers (vLLM and llama-server log it and go on, which a
misspelt field would pass unseen). llama-server's own sampler fields are known (`llama_samplers`), and
vLLM's (`vllm_request`) and the fields of a constrained text (`constraint_request`) are declared apart.
What the values may be, and what each means, is decided after (`max_gpt2.serving.api.requests`).
Some fields are accepted with no effect (`NO_EFFECT`), some refused whenever set (`REFUSED`):
each with why, which the refusal and docs/serving.md repeat.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError
from starlette.responses import JSONResponse

from max_gpt2.max_internals import error_body
from max_gpt2.serving.api import vllm_request
from max_gpt2.serving.api.constraint_request import Constrained
from max_gpt2.serving.api.llama_samplers import LlamaServerFields
from max_gpt2.serving.api.vllm_request import VllmChatFields, VllmFields

# Fields that change nothing for GPT-2 on this server, accepted as OpenAI, vLLM and MAX accept them:
# the JSON type each takes, and why it changes nothing.
NO_EFFECT: dict[str, tuple[Any, str]] = {
    "user": (str, "an end-user id OpenAI keeps for abuse monitoring; nothing here reads it"),
    "reasoning_split": (bool, "GPT-2 writes no reasoning to split off"),
    "metadata": (dict[str, Any], "tags OpenAI keeps with stored completions; nothing is stored here"),
    "service_tier": (str, "there is one tier here"),
    "safety_identifier": (str, "`user`'s successor at OpenAI, for abuse monitoring; nothing here reads it"),
    "prompt_cache_key": (str, "OpenAI routes prompt caching by it; here prompts' pages are reused by tokens"),
    "prompt_cache_retention": (
        Literal["in_memory", "24h"],
        "a longest retention: prompts' pages stay in memory while there is room for them, within either",
    ),
    **vllm_request.NO_EFFECT,
}
# Fields refused unless left unset (null, false, or the empty value given) or `HARMLESS`: why, per field.
REFUSED = {
    "suffix": "GPT-2 writes left to right and cannot insert text before a suffix",
    "thinking_temperature": "GPT-2 has no reasoning block to give a temperature of its own",
    "reasoning": "GPT-2 has no reasoning to configure",
    "reasoning_effort": "GPT-2 has no reasoning to configure",
    "target_endpoint": "disaggregated serving is not used here",
    "dkv_cache_hint": "disaggregated serving is not used here",
    "functions": "the legacy function calling: give tools and a tool_choice naming the function",
    "function_call": "the legacy function calling: give tools and a tool_choice naming the function",
    "audio": "GPT-2 reads and writes text only",
    "modalities": "GPT-2 reads and writes text only",
    "prediction": "predicted outputs are not used here",
    "moderation": "no moderation model runs here",
    "store": "completions are not stored here",
    "web_search_options": "this server searches nothing",
    "verbosity": "GPT-2 has no verbosity to set; max_tokens bounds a text's length",
    **vllm_request.REFUSED,
}
# Values of a `REFUSED` field that ask for what is done anyway.
HARMLESS: dict[str, tuple[Any, ...]] = {"modalities": (["text"],), **vllm_request.HARMLESS}


class StreamOptions(BaseModel):
    """OpenAI's `include_usage` (a last chunk with `usage`) and vLLM's `continuous_usage_stats` (on each)."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool = False  # OpenAI's random padding of each streamed event: none here

    @field_validator("include_obfuscation")
    @classmethod
    def _unpadded(cls, padded: bool) -> bool:
        if padded:
            raise PydanticCustomError(
                "padding", "this server pads no streamed event (vLLM's neither); give false"
            )
        return padded

    @field_validator("continuous_usage_stats")
    @classmethod
    def _with_usage(cls, every: bool, info: ValidationInfo) -> bool:
        if every and not info.data.get("include_usage"):
            raise PydanticCustomError("usage", "only with include_usage: true (vLLM reads it only then)")
        return every


class PromptCacheOptions(BaseModel):
    """OpenAI's `prompt_cache_options`: `implicit` (the default) reuses kept pages as MAX's prefix cache
    finds them; `explicit` where no message part has a `prompt_cache_breakpoint` reads none, as OpenAI's
    then caches nothing (`chat_prompt.reads_kept_pages`); `ttl` only OpenAI's one value."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["implicit", "explicit"] = "implicit"
    ttl: Literal["30m"] = "30m"


# Every field of `REFUSED`, of any JSON type: set, it is refused by name (`requests.check`); and every
# field of `NO_EFFECT`, of its type, read by nothing.
Refused = create_model(
    "Refused", __config__=ConfigDict(extra="forbid"), **dict.fromkeys(REFUSED, (Any, None))
)
Ignored = create_model(
    "Ignored", __base__=Refused, **{field: (kind | None, None) for field, (kind, _) in NO_EFFECT.items()}
)


class Sampling(Ignored, Constrained, LlamaServerFields, VllmFields):
    """The fields completions and chat completions share: how tokens are picked, how a choice ends,
    how many there are, how they come back and what they must be."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float | bool] | list[tuple[int | str, float | bool]] | None = None
    seed: int | None = None
    n: int | None = None
    best_of: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_prompt: bool = True


class CompletionRequest(Sampling):
    """`POST /v1/completions`."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None


class ChatRequest(Sampling, VllmChatFields):
    """`POST /v1/chat/completions`: `messages` are checked one by one (`max_gpt2.serving.api.chat`)."""

    messages: list[Any]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    tools: list[Any] | None = None  # called only as `tool_choice` asks (`max_gpt2.serving.api.tools`)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


class TokenizeRequest(BaseModel):
    """`POST /tokenize`: llama-server's shape (`content`, `add_special`, `with_pieces`) or vLLM's
    (`prompt` or `messages`, `add_special_tokens`, `return_token_strs`)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    content: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    add_special: bool | None = None
    add_special_tokens: bool | None = None
    with_pieces: bool = False
    return_token_strs: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    """`POST /detokenize`: `tokens`, in llama-server's shape and vLLM's alike."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


class Refusal(Exception):
    """A request this server will not run: the HTTP status, the field (OpenAI's `param`) and why, the
    headers HTTP asks of that status (a 401's `WWW-Authenticate`, a 405's `Allow`), and what the error
    object carries besides (`extra`: OpenAI's `code` where it has one, llama-server's numbers)."""

    def __init__(
        self,
        param: str | None,
        message: str,
        status: int = 400,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.param, self.message, self.status, self.headers = param, message, status, headers
        self.extra = extra or {}


def refusal_response(refusal: Refusal) -> JSONResponse:
    """OpenAI's error body for `refusal` (as MAX's own errors carry it), its `param` the field it names
    and its `extra` fields (a `code` in place of MAX's, the status)."""
    body = error_body(refusal.status, refusal.message, refusal.param)
    body["error"].update(refusal.extra)
    return JSONResponse(body, refusal.status, refusal.headers)


def not_supported(message: str) -> JSONResponse:
    """llama-server's 501 `not_supported_error`, which it answers for what a flag it was not started with
    would allow."""
    return refusal_response(Refusal(None, message, 501, extra={"type": "not_supported_error", "code": 501}))


Model = TypeVar("Model", bound=BaseModel)


def parse(model: type[Model], body: bytes) -> Model:
    """`body` (JSON) as `model`; a `Refusal` naming the first field that does not fit, or the body."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        first = error.errors()[0]
        loc = [str(part) for part in first["loc"]]
        if first["type"] == "json_invalid" or not loc:
            raise Refusal(
                None, f"the body is not a JSON object of this route's fields: {first['msg']}"
            ) from None
        field = loc[0] if loc[0] in UNIONS else ".".join(loc)
        if first["type"] == "extra_forbidden":
            raise Refusal(field, f"{field}: not a field this route takes") from None
        if first["type"] == "missing":
            raise Refusal(field, f"{field}: required") from None
        got = repr(first.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        says = f"must be {UNIONS[field]}" if field in UNIONS else first["msg"]
        raise Refusal(field, f"{field}: {says}; got {got}") from None


# What a field of several JSON types may be, said once for all its types' errors.
UNIONS = {
    "prompt": "a string, token ids, or a list of either",
    "input": "a string or a list (of texts or token ids where it is embedded; of items for a response)",
    "stop": "a string or a list of strings",
    "logit_bias": "an object of token ids to biases, or a list of [id, bias] pairs (a bias false: banned)",
}


def unset(value: Any) -> bool:
    """Whether a client left a field unset (null, false, or an empty string, list or object)."""
    return value is None or value is False or value == "" or value == [] or value == {}
