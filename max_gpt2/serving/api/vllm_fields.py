"""vLLM's own sampling and output fields on the OpenAI routes (`/v1/completions`, chat), read as vLLM
reads them (its `CompletionRequest` and `ChatCompletionRequest`):

- `skip_special_tokens` (true): false writes special tokens' text (`<|endoftext|>`, past an
  `ignore_eos`) into the choice's text, as Hugging Face's `decode` does (`choices.Rules`);
- `truncate_prompt_tokens`: each prompt cut to its last N tokens before it runs (-1: the context's
  length), or its first N with `truncation_side: "right"`, as vLLM cuts it (`kept`, `cut`);
- `allowed_token_ids`: only those ids may come, every other banned before any other control
  (`max_gpt2.serving.logit_edits.controlled`);
- `bad_words`: a word's last token is banned where the text so far ends with the rest of it, as
  vLLM encodes the words (`GPT2TextTokenizer.bad_word_ids`) and bans them;
- `return_tokens_as_token_ids`: log-probability entries name each token `token_id:N`, so that one
  that is part of a character stays told apart (`choices.TokenNames`);
- `priority`: 0 alone: requests run first come, first served (vLLM refuses the rest too unless
  started with priority scheduling);
- `request_id`: the answer's `id` is the route's prefix and it (MAX's own id still names the request
  inside, so two clients giving the same one cannot collide);
- `prompt_logprobs`: each prompt token after the first with its log-probability, its rank and the k
  likeliest alternatives (`prompt_report`), on a completion's choices and beside a chat's; not streamed,
  as vLLM's (0 streamed asks for nothing shown, and is taken);
- `logprob_token_ids`: each new token's alternatives are the ids listed, whatever their likelihood, with
  `logprobs` set, as vLLM's (the worker's part: `max_gpt2.serving.vllm_logprobs`);
- `stream_interval`: a streamed choice's tokens come N an event, its first and last events sent at once,
  as vLLM batches them (`in_groups`; this server's own interval is 1);
- `repetition_detection`: a choice ends once its tokens repeat a pattern (`max_gpt2.serving.api.repetition`);
- `return_prompt_text` (chat): the rendered prompt's text beside the answer (`max_gpt2.serving.api.chat`);
- `documents` (chat): passed to the chat template, as vLLM passes them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from max_gpt2.serving.api.choices import Chunk, Token
from max_gpt2.serving.api.protocol import ChatRequest, CompletionRequest, Refusal
from max_gpt2.serving.api.token_fields import token_id
from max_gpt2.serving.api.token_names import TokenNames

if TYPE_CHECKING:  # the served model's route state, which imports this module's importer
    from max_gpt2.serving.api.served import Served

MAX_LOGPROBS = 20  # alternatives a token, as vLLM allows (`max_gpt2.serving.model`'s graph gives up to 31)
LOWEST_LOGPROB = -9999.0  # what vLLM writes for a log-probability of -inf, which JSON cannot carry


def vllm_asks(body: CompletionRequest | ChatRequest, vocab_size: int, context_length: int) -> dict[str, Any]:
    """`Asked`'s fields for `body`'s vLLM fields, each checked; a `Refusal` naming the first out of range."""
    if body.priority:
        raise Refusal(
            "priority", f"priority: 0 here (requests run first come, first served); got {body.priority}"
        )
    allowed = body.allowed_token_ids
    if allowed is not None and not allowed:
        raise Refusal("allowed_token_ids", "allowed_token_ids: empty; no token could come")
    for index, token in enumerate(allowed or ()):
        token_id("allowed_token_ids", f"allowed_token_ids[{index}]", token, vocab_size)
    if blank := [index for index, word in enumerate(body.bad_words or ()) if not word.strip()]:
        raise Refusal("bad_words", f"bad_words[{blank[0]}]: no word (empty, or spaces alone)")
    return {
        "prompt_cut": kept(body, context_length),
        "allowed_ids": None if allowed is None else tuple(sorted(set(allowed))),
        "ids_as_names": bool(body.return_tokens_as_token_ids),
        "answer_id": body.request_id,
        "bad_words": tuple(body.bad_words) if body.bad_words else None,
        "prompt_logprobs": prompt_logprobs_asked(body),
        "logprob_ids": listed_ids(body, vocab_size),
        "stream_interval": stream_interval(body.stream_interval),
        "prompt_text": bool(getattr(body, "return_prompt_text", False)),
    }


def stream_interval(asked: int | None) -> int:
    """Tokens a streamed event brings at most (`stream_interval`, 1 unset); a `Refusal` below 1."""
    if asked is not None and asked < 1:
        raise Refusal("stream_interval", f"stream_interval: 1 or more tokens an event; got {asked}")
    return asked or 1


def in_groups(chunks: AsyncGenerator[Chunk, None], size: int) -> AsyncIterator[Chunk]:
    """`chunks` (a choice's, one a token) joined up to `size` at a time, as vLLM's `stream_interval` sends
    them (`grouped`); for 1, `chunks` themselves, with no step added to a token's way."""
    return chunks if size == 1 else grouped(chunks, size)


async def grouped(chunks: AsyncGenerator[Chunk, None], size: int) -> AsyncIterator[Chunk]:
    """`chunks` joined `size` at a time: the first sent as it comes, the last (the finish) with whatever
    waited before it."""
    waiting: list[Chunk] = []
    first = True
    async with aclosing(chunks):  # closed with this: a choice left unread tells the worker to stop
        async for chunk in chunks:
            waiting.append(chunk)
            if first or chunk.finish is not None or len(waiting) == size:
                yield Chunk(
                    "".join(each.text for each in waiting),
                    tuple(token for each in waiting for token in each.tokens),
                    chunk.finish,
                )
                waiting, first = [], False


def listed_ids(body: CompletionRequest | ChatRequest, vocab_size: int) -> tuple[int, ...] | None:
    """The ids whose log-probabilities each new token reports (`logprob_token_ids`), each once, or None;
    a `Refusal` for an empty list, an id outside the vocabulary, or where vLLM refuses them: without
    `logprobs`, or with `echo` and `max_tokens: 0` (no new token)."""
    ids = body.logprob_token_ids
    if ids is None:
        return None
    if not ids:
        raise Refusal(
            "logprob_token_ids", "logprob_token_ids: empty; list the ids to report, or leave it out"
        )
    for index, token in enumerate(ids):
        token_id("logprob_token_ids", f"logprob_token_ids[{index}]", token, vocab_size)
    if body.logprobs is None or body.logprobs is False:
        raise Refusal("logprob_token_ids", "logprob_token_ids: needs logprobs set, as vLLM's")
    if isinstance(body, CompletionRequest) and body.echo and body.max_tokens == 0:
        raise Refusal("logprob_token_ids", "logprob_token_ids: echo with max_tokens 0 makes no new token")
    if body.post_sampling_probs:
        raise Refusal(
            "logprob_token_ids",
            "logprob_token_ids: of the model's logits, not of what each token is drawn from",
        )
    return tuple(dict.fromkeys(ids))


def prompt_logprobs_asked(body: CompletionRequest | ChatRequest) -> int | None:
    """The alternatives each prompt token reports (`prompt_logprobs`), None for no report; a `Refusal`
    past vLLM's bound (-1, the whole vocabulary, is past it too), streamed, or beside llama-server's
    `post_sampling_probs` (a prompt's tokens were not drawn)."""
    count = body.prompt_logprobs
    if count is None or (body.stream and count == 0):  # vLLM takes 0 streamed, and shows nothing
        return None
    if not 0 <= count <= MAX_LOGPROBS:
        raise Refusal(
            "prompt_logprobs", f"prompt_logprobs: 0 to {MAX_LOGPROBS} alternatives a token; got {count}"
        )
    if body.stream:
        raise Refusal("prompt_logprobs", "prompt_logprobs: not streamed (as vLLM's); leave out stream")
    if body.post_sampling_probs:
        raise Refusal(
            "prompt_logprobs",
            "prompt_logprobs: a prompt's tokens were not drawn; leave out post_sampling_probs",
        )
    return count


def prompt_report(prompt: Sequence[Token], count: int | None, names: TokenNames) -> dict[str, Any]:
    """vLLM's `prompt_logprobs` of `prompt` where asked (`count` alternatives; None: not asked, nothing):
    None for the first token, then each token's entry (`logprob`, `rank`, `decoded_token`) by id, and its
    `count` likeliest alternatives' (ranks 1 to `count`), where the token is among them its entry theirs,
    in its own place first."""
    if count is None:
        return {}

    def entry(token: int, logprob: float, rank: int | None) -> dict[str, Any]:
        return {"logprob": max(logprob, LOWEST_LOGPROB), "rank": rank, "decoded_token": names.text(token)}

    entries: list[dict[int, Any] | None] = [None]
    for token in prompt[1:]:
        assert token.logprob is not None, "a prompt reported: each token after the first has its own"
        ranked = {token.id: entry(token.id, token.logprob, token.rank)}
        for place, (other, logprob) in enumerate(list(token.top.items())[:count], start=1):
            ranked[other] = entry(other, logprob, place)
        entries.append(ranked)
    return {"prompt_logprobs": entries}


def prompt_cut(keep: int | None, context_length: int) -> int | None:
    """How many of a prompt's last tokens `truncate_prompt_tokens` (`keep`) keeps, -1 the context's
    length; None where it is not given, and a `Refusal` where it is out of range."""
    if keep is not None and not (keep == -1 or 1 <= keep <= context_length):
        raise Refusal(
            "truncate_prompt_tokens",
            f"truncate_prompt_tokens: -1 (the context's {context_length}) or 1 to {context_length}; "
            f"got {keep}",
        )
    return context_length if keep == -1 else keep


def kept(body: CompletionRequest | ChatRequest, context_length: int) -> slice | None:
    """What of each prompt `truncate_prompt_tokens` keeps: its last N tokens, or its first N where
    `truncation_side` is "right"; None where nothing is cut."""
    keep = prompt_cut(body.truncate_prompt_tokens, context_length)
    if keep is None:
        return None
    return slice(keep) if body.truncation_side == "right" else slice(-keep, None)


def cut(prompts: Sequence[Any], keep: slice | None, served: Served) -> list[Any]:
    """Each of `prompts` (a text or ids) cut to the tokens `keep` keeps, as ids; as given where `keep` is
    None."""
    if keep is None:
        return list(prompts)
    return [as_ids(prompt, served)[keep] for prompt in prompts]


def as_ids(prompt: str | Sequence[int], served: Served) -> list[int]:
    """A prompt's token ids: a text's as the served tokenizer encodes it, ids as they are."""
    return served.tokenizer.delegate.encode(prompt) if isinstance(prompt, str) else list(prompt)
