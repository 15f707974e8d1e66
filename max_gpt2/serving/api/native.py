"""llama-server's own completion API, for its clients: `POST /completion` (and `/completions`).

A native request is read with llama-server's field names and defaults (`NativeCompletion`:
temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, `n_predict` -1 for up to the context's end,
`seed` -1 for a random one), turned into the fields `/v1/completions` takes (`as_completion`),
checked and run as one, and answered in llama-server's shape (`Native`): `content`, `tokens`
(with `return_tokens`), `stop`, `stop_type` ("eos", "limit" or "word"), `stopping_word`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `timings` and `completion_probabilities`
(`n_probs`). Streamed, each event is one such object with `stop: false`, the last with `stop:
true`, and no `[DONE]`, as llama-server streams. Samplers this server does not have (mirostat,
DRY, XTC, typical-p, top-n-sigma, dynamic temperature, tail-free) are refused when set to act
(`OFF`), their own parameters taken while they are off; llama-server's penalties count the last
`repeat_last_n` tokens, prompt and text alike: `repeat_penalty` is Hugging Face's over the whole
context here, so it needs `repeat_last_n: -1`, and the frequency and presence penalties (OpenAI's
here, over the text alone) are refused. One difference is kept: top-k, top-p and min-p cut the
distribution at the request's temperature here, as vLLM's and MAX's samplers do, where llama-server
cuts before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from max.serve.router.openai_routes import record_request_end, record_request_start
from pydantic import AliasChoices, ConfigDict, Field, create_model
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.answer import compact, counts, side_by_side, start, unless_client_leaves, withdraw
from max_gpt2.serving.api.choices import Choice, Finish, Token, TokenNames
from max_gpt2.serving.api.protocol import CompletionRequest, Refusal, parse, refusal_response
from max_gpt2.serving.api.requests import Asked, check, prompts
from max_gpt2.serving.api.served import Served

# llama-server's samplers and settings this server does not have: each one's field, whether a value
# leaves it off, and what leaves it off. Their parameters (`TAKEN`) change nothing while they are off.
OFF: dict[str, tuple[Callable[[Any], bool], str]] = {
    "mirostat": (lambda value: value == 0, "0"),
    "typical_p": (lambda value: value >= 1, "1"),
    "tfs_z": (lambda value: value >= 1, "1"),
    "dynatemp_range": (lambda value: value <= 0, "0"),
    "xtc_probability": (lambda value: value <= 0, "0"),
    "dry_multiplier": (lambda value: value <= 0, "0"),
    "top_n_sigma": (lambda value: value < 0, "-1"),
    "n_indent": (lambda value: value == 0, "0"),
    "t_max_predict_ms": (lambda value: value <= 0, "0"),
    "post_sampling_probs": (lambda value: not value, "false"),
    "response_fields": (lambda value: not value, "[]"),
    "lora": (lambda value: not value, "[]"),
    "n_cmpl": (lambda value: value == 1, "1"),
}
# Fields taken with any value, changing nothing here: the parameters of samplers that are off, the slot
# (one prefix cache serves every request), and what only shapes llama-server's logs or its context shift.
TAKEN = (
    "mirostat_tau", "mirostat_eta", "dynatemp_exponent", "xtc_threshold", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "penalize_nl", "min_keep", "n_keep", "id_slot",
    "timings_per_token", "verbose", "t_max_prompt_ms", "n_discard", "return_progress",
)  # fmt: skip
RENAMED = {"max_tokens": "n_predict", "logprobs": "n_probs", "repetition_penalty": "repeat_penalty"}


# Every field of `OFF` and `TAKEN`, of any JSON type: checked, or taken, by `as_completion`.
_Samplers: Any = create_model(
    "_Samplers", __config__=ConfigDict(extra="forbid"), **dict.fromkeys((*OFF, *TAKEN), (Any, None))
)


class NativeCompletion(_Samplers):
    """`POST /completion`'s body: llama-server's fields, with its defaults."""

    prompt: str | list[int] | list[str | list[int]]
    n_predict: int = Field(
        -1, validation_alias=AliasChoices("n_predict", "max_tokens", "max_completion_tokens")
    )
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    stop: list[str] = Field(default_factory=list)
    stream: bool = False
    cache_prompt: bool = True
    return_tokens: bool = False
    n_probs: int = 0
    logit_bias: dict[str, float | bool] | list[tuple[int | str, float | bool]] | None = None
    ignore_eos: bool = False
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    model: str | None = None
    samplers: Any = None


def defaults() -> dict[str, Any]:
    """The fields `/completion` honours, with their defaults: `/props` shows them, as llama-server shows its
    `default_generation_settings.params`."""
    unset = {"prompt", "model", "samplers", *OFF, *TAKEN}
    return NativeCompletion(prompt="").model_dump(exclude=unset, exclude_none=True)


def as_completion(native: NativeCompletion, context_length: int) -> CompletionRequest:
    """The `/v1/completions` request that asks what `native` asks; a `Refusal` naming the native field
    for what this server cannot honour."""
    for field, (off, value) in OFF.items():
        given = getattr(native, field)
        try:
            acts = given is not None and not off(given)
        except TypeError:  # not a number
            acts = True
        if acts:
            raise Refusal(
                field, f"{field}: this server has no such sampler or setting; leave it out or {value}"
            )
    for field in ("frequency_penalty", "presence_penalty"):
        if getattr(native, field) != 0:
            raise Refusal(
                field,
                f"{field}: llama-server's counts the prompt's tokens too, this server's (OpenAI's, at "
                "/v1/completions) only the generated ones; leave it out or 0",
            )
    if native.samplers is not None:
        raise Refusal(
            "samplers", "samplers: the order is fixed here (penalties, then temperature, then the cuts)"
        )
    if native.n_predict == 0 or native.n_predict < -1:
        raise Refusal(
            "n_predict", f"n_predict: -1 (to the context's end) or at least 1; got {native.n_predict}"
        )
    if native.repeat_penalty != 1 and not (
        native.repeat_last_n == -1 or native.repeat_last_n >= context_length
    ):
        raise Refusal(
            "repeat_last_n",
            f"repeat_last_n: the penalty counts the whole context here; give -1 (or {context_length})",
        )
    if native.n_probs < 0:
        raise Refusal("n_probs", f"n_probs: 0 or more; got {native.n_probs}")
    return CompletionRequest(
        prompt=native.prompt,
        model=native.model,
        max_tokens=None if native.n_predict == -1 else native.n_predict,
        temperature=native.temperature,
        top_k=native.top_k,
        top_p=native.top_p,
        min_p=native.min_p,
        seed=native.seed,
        stop=native.stop or None,
        stream=native.stream,
        cache_prompt=native.cache_prompt,
        return_token_ids=native.return_tokens,
        logprobs=native.n_probs or None,
        logit_bias=native.logit_bias,
        ignore_eos=native.ignore_eos,
        grammar=native.grammar,
        json_schema=native.json_schema,
        repetition_penalty=native.repeat_penalty,
    )


async def create_native_completion(request: Request) -> Response:
    served = Served.of(request)
    try:
        native = parse(NativeCompletion, await request.body())
        body = as_completion(native, served.context_length)
        model = served.model_name(body.model)
        asked = named_natively(lambda: check(body, served.vocab_size))
        if asked.constraint is not None:
            await asyncio.to_thread(served.check_constraint, asked)
        choices = await start(request, served, asked, model, prompts(body.prompt), "prompt")
    except Refusal as refusal:
        return refusal_response(refusal)
    results = Results(asked, TokenNames(served.engine), model, choices)
    record_request_start()  # MAX's running-requests gauge, and its request counts at the end
    if asked.stream:
        return EventSourceResponse(results.events(request.url.path), ping=100000, sep="\n")
    try:
        whole = await unless_client_leaves(request, asyncio.gather(*map(results.whole, range(len(choices)))))
    finally:
        await withdraw(choices)
        results.record(request.url.path)
    return JSONResponse(whole[0] if len(whole) == 1 else whole)


def named_natively(check_fields: Callable[[], Asked]) -> Asked:
    """`check_fields()`, its refusal naming the field as llama-server's clients name it."""
    try:
        return check_fields()
    except Refusal as refusal:
        theirs = RENAMED.get(refusal.param or "", refusal.param)
        refusal.message = refusal.message.replace(f"{refusal.param}:", f"{theirs}:", 1)
        refusal.param = theirs
        raise


class Results:
    """llama-server's JSON for each prompt's result, whole or streamed (module docstring)."""

    def __init__(self, asked: Asked, names: TokenNames, model: str, choices: list[Choice]) -> None:
        self.asked, self.names, self.model, self.choices = asked, names, model, choices
        self.started = time.perf_counter()
        self.first: dict[int, float] = {}  # when each result's first token came
        self.text: dict[int, list[str]] = {index: [] for index in range(len(choices))}
        self.tokens: dict[int, list[Token]] = {index: [] for index in range(len(choices))}

    async def whole(self, index: int) -> dict[str, Any]:
        """Result `index`, once its choice has ended."""
        finish: Finish | None = None
        async for chunk in self.choices[index].chunks():
            self._add(index, chunk.text, chunk.tokens)
            finish = chunk.finish or finish
        assert finish is not None, "a choice ends with a finish"
        text = "".join(self.text[index])
        return self._final(index, text, self.tokens[index], finish)

    async def events(self, path: str) -> AsyncIterator[str]:
        """Each result's partial objects as its chunks come, then its final one; no `[DONE]`."""
        try:
            async for index, chunk in side_by_side([choice.chunks() for choice in self.choices]):
                self._add(index, chunk.text, chunk.tokens)
                if chunk.text or chunk.tokens:
                    yield compact(self._partial(index, chunk.text, chunk.tokens))
                if chunk.finish is not None:
                    yield compact(self._final(index, "", (), chunk.finish))
        finally:
            self.record(path)

    def record(self, path: str) -> None:
        """MAX's metrics of the request's end, as its own routes record them."""
        elapsed = (time.perf_counter() - self.started) * 1000
        record_request_end(path, elapsed, *counts(self.choices, self.asked))

    def _add(self, index: int, text: str, tokens: Sequence[Token]) -> None:
        if tokens:
            self.first.setdefault(index, time.perf_counter())
        self.text[index].append(text)
        self.tokens[index].extend(tokens)

    def _partial(self, index: int, text: str, tokens: Sequence[Token]) -> dict[str, Any]:
        choice = self.choices[index]
        return {
            "index": index,
            "content": text,
            "tokens": [token.id for token in tokens] if self.asked.return_token_ids else [],
            "stop": False,
            "model": self.model,
            "tokens_predicted": choice.made,
            "tokens_evaluated": len(choice.prompt),
            **self._probabilities(tokens),
        }

    def _final(self, index: int, text: str, tokens: Sequence[Token], finish: Finish) -> dict[str, Any]:
        """A result's last object; streamed (`text` ""), its text and tokens came in the partial ones."""
        choice, now = self.choices[index], time.perf_counter()
        first = self.first.get(index, now)
        prompt_ms, predicted_ms = (first - self.started) * 1000, (now - first) * 1000
        word = isinstance(finish.stop_reason, str)
        return {
            **self._partial(index, text, tokens),
            "stop": True,
            "prompt": "".join(token.text for token in choice.prompt),
            "has_new_line": "\n" in "".join(self.text[index]),
            "truncated": False,
            "stop_type": "limit" if finish.reason == "length" else "word" if word else "eos",
            "stopping_word": finish.stop_reason if word else "",
            "tokens_cached": choice.cached,
            "timings": {  # the prompt's: until the first token, queueing included
                "prompt_n": len(choice.prompt) - choice.cached,
                "prompt_ms": prompt_ms,
                "predicted_n": choice.made,
                "predicted_ms": predicted_ms,
                "predicted_per_second": choice.made * 1000 / predicted_ms if predicted_ms else None,
            },
        }

    def _probabilities(self, tokens: Sequence[Token]) -> dict[str, Any]:
        """llama-server's `completion_probabilities` of `tokens`, where `n_probs` asked for them."""
        if self.asked.logprobs is None or not tokens:
            return {}
        return {"completion_probabilities": [self._entry(token.id, token.logprob, token) for token in tokens]}

    def _entry(self, token: int, value: float | None, of: Token | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": token,
            "token": self.names(token),
            "bytes": self.names.bytes(token),
            "logprob": value,
        }
        if of is not None:
            ranked = list(of.top.items())[: self.asked.logprobs]
            entry["top_logprobs"] = [self._entry(alternative, logprob) for alternative, logprob in ranked]
        return entry
