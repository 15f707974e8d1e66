"""The server's tokenizer: MAX's `TextTokenizer`, refusing what the model worker could not run.

It runs in MAX's API process, before a request reaches the model worker, so an
`InputError` raised here is an HTTP 400 for that request alone and the server
goes on; the same request let through would raise inside the worker and take the
whole server down with it. Every prompt is seen here as token ids, whether it came
as text or as ids, so this is where they are checked: each id inside the model's
vocabulary (the embedding's gather has no other guard), at least one token, and
room in the context for a new one. `echo` with `logprobs` asks for the prompt's
log-probabilities, which need every token's logits: a server started without
`--enable-echo` would fail on it inside the worker too; such a request reads no page MAX's prefix
cache kept (`reads_cached_prompt`), as it would have no logits for those tokens. MAX's own checks here
raise ValueError, which its route answers with "Value error." alone: they are
passed on as an `InputError`, so the client reads what was wrong. The context it makes is a
`GPT2Context`, carrying a `GPT2Request`'s `logit_bias` and constraint to the worker
(`max_gpt2.serving.context`). `grammars` is the grammar engine for the model's vocabulary: the
route checks a constraint with it, the worker's pipeline masks with it; `dry_heads` finds DRY's
sequence breakers among the vocabulary's tokens for the worker's sampler chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
from max.pipelines.context.exceptions import InputError, PromptTooLongError
from max.pipelines.lib import PipelineConfig, TextTokenizer
from max.pipelines.modeling.types import TextGenerationRequest
from tokenizers import Tokenizer

from max_gpt2.inference.constraints import GrammarEngine
from max_gpt2.inference.dry import Heads, breaker_heads
from max_gpt2.inference.tokenizer import load_tokenizer, token_bytes
from max_gpt2.model.config import GPT2Config
from max_gpt2.serving.context import GPT2Context, GPT2Request


class ContextExceeded(InputError):
    """A prompt longer than the context allows (all of it but `room` tokens, those it is to generate);
    `fields` for its error object: OpenAI's `code` and llama-server's numbers (which its web page reads)."""

    def __init__(self, tokens: int, context: int, where: str = "prompt", room: int = 1) -> None:
        leaves = ", which leave no room for a new one" if room else ""
        super().__init__(
            f"{where}: This model's maximum context length is {context} tokens, however you requested "
            f"{tokens} tokens{leaves}. Please reduce the length of the input."
        )  # in OpenAI's and vLLM's words, which clients read the context's length from
        self.fields = {"code": "context_length_exceeded", "n_prompt_tokens": tokens, "n_ctx": context}
        self.where, self.room = where, room

    def __reduce__(self) -> tuple[type, tuple[int, int, str, int]]:  # pickled as made, to cross processes
        return ContextExceeded, (self.fields["n_prompt_tokens"], self.fields["n_ctx"], self.where, self.room)


class GPT2TextTokenizer(TextTokenizer):
    """`TextTokenizer` that refuses, with a 400 naming the field, prompts the model cannot run."""

    ROOM: ClassVar[int] = 1  # tokens a prompt must leave free in the context: the one it generates
    DRY_SETS: ClassVar[int] = 8  # sets of DRY breakers kept found (each a few thousand ids at most)

    def __init__(self, model_path: str, pipeline_config: PipelineConfig, **kwargs: Any) -> None:
        super().__init__(model_path, pipeline_config, **kwargs)
        self.echo_enabled = pipeline_config.model.enable_echo
        config = GPT2Config.from_pretrained(pipeline_config.model.model_path)
        self.model_vocab_size, self.n_positions = config.vocab_size, config.n_positions
        self.n_embd = config.n_embd  # an embedding's width
        self.model_path = model_path
        self._dry_heads: dict[tuple[str, ...], Heads] = {}  # by breakers, the latest `DRY_SETS` asked for

    @cached_property
    def vocabulary(self) -> Tokenizer:
        """The model's own tokenizer (`tokenizers`'), loaded at its first use."""
        tokenizer = load_tokenizer(self.model_path)
        assert tokenizer is not None, "max-gpt2 serve refuses a checkpoint without a tokenizer"
        return tokenizer

    @cached_property
    def grammars(self) -> GrammarEngine:
        """The grammar engine for the model's vocabulary and end-of-text ids, made at its first use."""
        return GrammarEngine(self.vocabulary, self.model_vocab_size, sorted(self.eos_token_ids))

    @cached_property
    def pieces(self) -> list[bytes]:
        """Each token's bytes, by id (none for an id the model has and the tokenizer not)."""
        known = self.vocabulary.get_vocab_size(with_added_tokens=True)
        return [token_bytes(self.vocabulary, i) if i < known else b"" for i in range(self.model_vocab_size)]

    def dry_heads(self, breakers: tuple[str, ...]) -> Heads:
        """DRY's sequence `breakers` among the vocabulary's tokens (`max_gpt2.inference.dry`), each set
        found once while it is among the latest asked for."""

        def encode(text: str) -> list[int]:
            return self.vocabulary.encode(text, add_special_tokens=False).ids

        if breakers not in self._dry_heads:
            if len(self._dry_heads) >= self.DRY_SETS:
                del self._dry_heads[next(iter(self._dry_heads))]
            self._dry_heads[breakers] = breaker_heads(breakers, self.pieces, encode)
        return self._dry_heads[breakers]

    def bad_word_ids(self, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """vLLM's `bad_words` as token ids, as vLLM encodes them: each word, its leading spaces stripped,
        as it would begin a text, and after a space too where that gives as many tokens, the first
        another (a word within a text)."""
        found: list[tuple[int, ...]] = []
        for word in words:
            bare, spaced = (
                self.vocabulary.encode(text, add_special_tokens=False).ids
                for text in (word.lstrip(), " " + word.lstrip())
            )
            found.append(tuple(bare))
            if len(spaced) == len(bare) and spaced[0] != bare[0]:
                found.append(tuple(spaced))
        return tuple(found)

    async def new_context(self, request: TextGenerationRequest) -> GPT2Context:
        if request.echo and request.logprobs and not self.echo_enabled:
            raise InputError(
                "echo with logprobs needs the prompt's log-probabilities, and this server was started "
                "without them: start it with --enable-echo (max-gpt2 serve does)"
            )
        if isinstance(request.prompt, Sequence) and not isinstance(request.prompt, str):
            self.check_ids(request.prompt)  # before MAX builds anything from them
        try:
            context = await super().new_context(request)
        except PromptTooLongError as error:  # MAX's words name no field: said as `check_ids` says it
            raise ContextExceeded(error.num_tokens, self.n_positions, room=self.ROOM) from None
        except ValueError as error:
            raise InputError(str(error)) from None
        self.check_ids(context.tokens.prompt)
        context = GPT2Context.of(context, request)
        if words := getattr(request, "bad_words", None):
            context.bad_word_ids = self.bad_word_ids(words)
        if not reads_cached_prompt(request):
            context.cache_salt = f"unshared {request.request_id}"  # no other request's pages match it
        return context

    def check_ids(self, ids: Sequence[int] | np.ndarray, where: str = "prompt") -> None:
        """Refuses `where`'s ids where there are none, one is outside the vocabulary, or they leave the
        context less than `ROOM` tokens."""
        ids = np.asarray(ids)
        if ids.size == 0:
            raise InputError(f"{where}: empty; GPT-2 needs at least one token")
        outside = np.flatnonzero((ids < 0) | (ids >= self.model_vocab_size))
        if outside.size:
            raise InputError(
                f"{where}: token id {int(ids[outside[0]])} at position {int(outside[0])} is outside the "
                f"model's vocabulary of {self.model_vocab_size} (ids 0 to {self.model_vocab_size - 1})"
            )
        if ids.size > self.n_positions - self.ROOM:
            raise ContextExceeded(int(ids.size), self.n_positions, where, self.ROOM)


class GPT2EmbeddingsTokenizer(GPT2TextTokenizer):
    """The tokenizer of a server of embeddings: a prompt may fill the whole context."""

    ROOM = 0


def reads_cached_prompt(request: TextGenerationRequest) -> bool:
    """Whether a request's prompt may start past pages MAX's prefix cache kept: not where it asks for the
    prompt's log-probabilities (`echo` with `logprobs`: a kept page has no logits; vLLM reads none
    for `prompt_logprobs` either), nor where it asks not to (llama-server's `cache_prompt: false`)."""
    echoes = bool(request.echo and request.logprobs)
    return not echoes and (not isinstance(request, GPT2Request) or request.cache_prompt)
