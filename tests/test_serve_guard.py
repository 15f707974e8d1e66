"""What the server decides about a request before MAX's engine sees it, without a server: each field's
checks (`max_gpt2.serving.api.protocol` and `requests`), the HTTP guard and routes (`api.guard`,
`api.routes`: API key, routes, several names, CORS), the penalties the pipeline applies
(`max_gpt2.inference.logit_controls`) against Hugging Face's and OpenAI's formulas written out here,
and the options `max-gpt2 serve` passes on or refuses. Everything skips, saying why, where MAX's
serving extra is not installed."""

from __future__ import annotations

import argparse
import io
import json
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max_gpt2.inference.embeddings import Pooling
from max_gpt2.inference.logit_controls import LOWEST, ban, last_counts, penalize, token_counts
from tests.support import requires_serving

pytestmark = requires_serving()

GOOD = {"model": "gpt2", "prompt": "The cat", "max_tokens": 4}
VOCAB = 320
CONTEXT = 48  # LM's positions

# A bad value of each field this server refuses, and what the refusal must say.
REFUSED = [
    ({"prompt": []}, "prompt", "the list holds nothing"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": ["a", "b", ""]}, "prompt", "prompt[2]: empty"),
    ({"prompt": ["a", [1]]}, "prompt", "a string, token ids, or a list of either"),
    ({"prompt": None}, "prompt", "a string, token ids"),
    ({"max_tokens": -2}, "max_tokens", "at least 1"),
    ({"mirostat": 3}, "mirostat", "mirostat: 0 (off), 1 or 2 (Mirostat 2.0); got 3"),
    (
        {"lora": [{"id": 0, "scale": 1}]},
        "lora",
        "with an id of the adapters (none: no adapter is merged)",
    ),
    (
        {"adaptive_target": 0.5, "adaptive_decay": 1.5, "samplers": ["adaptive_p"]},
        "adaptive_decay",
        "0 to 0.99",
    ),
    ({"dry_multiplier": 0.8, "dry_allowed_length": -1}, "dry_allowed_length", "0 or more; got -1"),
    ({"dry_multiplier": 0.8, "dry_sequence_breakers": []}, "dry_sequence_breakers", "a non-empty list"),
    ({"n_indent": -2}, "n_indent", "n_indent: 0 or more; got -2"),
    ({"t_max_predict_ms": -5}, "t_max_predict_ms", "t_max_predict_ms: -1 (none) or more; got -5"),
    ({"min_keep": -2, "typical_p": 0.5}, "min_keep", "min_keep: 0 or more; got -2"),
    ({"repeat_last_n": -3}, "repeat_last_n", "-1 (the whole context), 0 (none) or more; got -3"),
    ({"priority": 1}, "priority", "priority: 0 here (requests run first come, first served); got 1"),
    (
        {"truncate_prompt_tokens": 0},
        "truncate_prompt_tokens",
        f"-1 (the context's {CONTEXT}) or 1 to {CONTEXT}",
    ),
    ({"allowed_token_ids": []}, "allowed_token_ids", "allowed_token_ids: empty; no token could come"),
    (
        {"allowed_token_ids": [1, VOCAB]},
        "allowed_token_ids",
        f"allowed_token_ids[1]: {VOCAB} is not a token id",
    ),
    ({"repeat_penalty": 1.2, "repetition_penalty": 1.1}, "repeat_penalty", "give one"),
    ({"repeat_penalty": 0}, "repetition_penalty", "above 0"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"temperature": -1}, "temperature", "between 0 and 2"),
    ({"temperature": float("nan")}, "temperature", "between 0 and 2"),
    ({"top_p": 2}, "top_p", "between 0 and 1"),
    ({"min_p": -0.5}, "min_p", "between 0 and 1"),
    ({"frequency_penalty": 2.5}, "frequency_penalty", "between -2 and 2"),
    ({"presence_penalty": -3}, "presence_penalty", "between -2 and 2"),
    ({"repetition_penalty": 0}, "repetition_penalty", "above 0"),
    ({"min_tokens": -1}, "min_tokens", "0 or more"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "more than max_tokens (4)"),
    ({"top_k": -2}, "top_k", "-1 or 0"),
    ({"logprobs": -1}, "logprobs", "0 to 20"),
    ({"logprobs": 21}, "logprobs", "0 to 20"),
    ({"seed": 2**64}, "seed", "64 bits"),
    ({"n": 0}, "n", "1 to 16"),
    ({"n": 17}, "n", "1 to 16"),
    ({"n": "two"}, "n", "valid integer"),
    ({"best_of": 3}, "best_of", "equal to n (1)"),
    ({"stop": ["a", ""]}, "stop", "stop[1]: empty"),
    ({"stop": [1]}, "stop", "a string or a list of strings"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "'x' is not a token id of the vocabulary (0 to 319)"),
    ({"logit_bias": {"320": 1}}, "logit_bias", "'320' is not a token id"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "logit_bias[5]: must be from -100 to 100, or false"),
    ({"logit_bias": {"5": True}}, "logit_bias", "logit_bias[5]: true biases nothing"),
    ({"logit_bias": [[5]]}, "logit_bias", "or a list of [id, bias] pairs"),
    ({"logit_bias": [["Hello", 1]]}, "logit_bias", "'Hello' is not a token id"),  # llama-server tokenizes it
    ({"suffix": "the end"}, "suffix", "cannot insert"),
    ({"thinking_temperature": 0.5}, "thinking_temperature", "no reasoning"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "no reasoning"),
    ({"target_endpoint": "x"}, "target_endpoint", "disaggregated"),
    ({"dkv_cache_hint": {"a": 1}}, "dkv_cache_hint", "disaggregated"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema: required"),
    ({"stream_options": {"include_usage": "often"}}, "stream_options.include_usage", "valid boolean"),
    ({"best_answer": True}, "best_answer", "not a field this route takes"),
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias", "'\u00b2' is not a token id"),  # a digit, not an ASCII one
    ({"stop_token_ids": [5, 320]}, "stop_token_ids", "stop_token_ids[1]: 320 is not a token id"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only with stream: true"),
    ({"modalities": ["text", "audio"]}, "modalities", "text only"),
    ({"use_beam_search": True, "n": 11}, "n", "n: 1 to 10 beams with use_beam_search"),
    ({"length_penalty": 1.5}, "length_penalty", "ranks the beams of use_beam_search"),
    ({"session_id": 7}, "session_id", "valid string"),
    ({"stream_interval": 0, "stream": True}, "stream_interval", "1 or more tokens an event; got 0"),
    ({"prompt_logprobs": 21}, "prompt_logprobs", "0 to 20 alternatives a token; got 21"),
    ({"prompt_logprobs": -1}, "prompt_logprobs", "got -1"),  # vLLM's whole vocabulary: past its bound too
    ({"prompt_logprobs": 2, "stream": True}, "prompt_logprobs", "not streamed"),
    ({"prompt_logprobs": 1, "post_sampling_probs": True}, "prompt_logprobs", "were not drawn"),
    ({"prompt_logprobs": 1, "use_beam_search": True}, "prompt_logprobs", "leave it out"),
    ({"logprob_token_ids": [], "logprobs": 1}, "logprob_token_ids", "empty"),
    (
        {"logprob_token_ids": [1, VOCAB], "logprobs": 1},
        "logprob_token_ids",
        f"[1]: {VOCAB} is not a token id",
    ),
    ({"logprob_token_ids": [1]}, "logprob_token_ids", "needs logprobs set"),
    ({"logprob_token_ids": [1], "logprobs": 1, "echo": True, "max_tokens": 0}, "logprob_token_ids", "no new"),
    ({"logprob_token_ids": [1], "logprobs": 1, "post_sampling_probs": True}, "logprob_token_ids", "drawn"),
    ({"logprob_token_ids": [1], "logprobs": 1, "use_beam_search": True}, "logprob_token_ids", "leave it out"),
    ({"repetition_detection": {"max_pattern_size": 4, "min_count": 1}}, "repetition_detection", "got 1"),
    (
        {"repetition_detection": {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}},
        "repetition_detection",
        "got 3 and 2",
    ),
    ({"repetition_detection": {"max_pattern_size": -1}}, "repetition_detection", "got 0 and -1"),
    ({"repetition_detection": {"size": 2}}, "repetition_detection.size", "not a field this route takes"),
    (
        {"repetition_detection": {"max_pattern_size": 2, "min_count": 2}, "use_beam_search": True},
        "repetition_detection",
        "leave it out",
    ),
    ({"truncation_side": "middle"}, "truncation_side", "'left' or 'right'"),
    ({"thinking_token_budget": 0}, "thinking_token_budget", "does not reason"),
    ({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params", "disaggregated"),
    ({"vllm_xargs": {"a": 1}}, "vllm_xargs", "no extension"),
    ({"logits_processors": ["a.b"]}, "logits_processors", "--logits-processor-pattern"),
    ({"return_prompt_text": True}, "return_prompt_text", "not a field this route takes"),  # chat's alone
]
# The same for chat completions' own fields.
CHAT = {"model": "gpt2", "messages": [{"role": "user", "content": "hi"}]}


def test_a_messages_text_parts_are_joined_by_newlines_as_vllm_and_llama_server_join_them():
    from max_gpt2.serving.api.chat_prompt import content

    parts = [{"type": "text", "text": "How"}, {"type": "text", "text": "are you?"}]
    assert content(parts, "messages[0]") == "How\nare you?" and content("hi", "messages[0]") == "hi"


def test_documents_reach_the_chat_template_as_vllm_passes_them():
    """vLLM's chat `documents`, for a template that shows them (GPT-2's own shows none)."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from max_gpt2.serving.api.chat_prompt import rendered
    from max_gpt2.serving.api.protocol import ChatRequest

    template = (
        "{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}] {% endfor %}{{ messages[0].content }}"
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), chat_template=template)
    served = SimpleNamespace(tokenizer=SimpleNamespace(delegate=tokenizer))
    chat = {"messages": [{"role": "user", "content": "Which?"}]}
    documents = [{"title": "A", "text": "one"}, {"title": "B", "text": "two"}]
    assert rendered(served, ChatRequest(**chat, documents=documents)) == "[A: one] [B: two] Which?"
    assert rendered(served, ChatRequest(**chat)) == "Which?"


CHAT_REFUSED = [
    ({"chat_template": "{{ messages }}"}, "chat_template", "--trust-request-chat-template"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl", "'30m'"),
    ({"prompt_cache_options": {"mode": "auto"}}, "prompt_cache_options.mode", "'implicit' or 'explicit'"),
    ({"moderation": {"model": "omni-moderation-latest"}}, "moderation", "no moderation model"),
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention", "'in_memory' or '24h'"),
    ({"mm_processor_kwargs": {"size": 4}}, "mm_processor_kwargs", "text alone"),
    ({"documents": ["a text"]}, "documents.0", "should be an object"),
    ({"messages": []}, "messages", "messages: empty"),
    ({"messages": [{"content": "hi"}]}, "messages", "messages[0].role: required"),
    (
        {"messages": [{"role": "robot", "content": "hi"}]},
        "messages",
        "messages[0].role: must be one of system",
    ),
    ({"messages": [{"role": "tool", "content": "4"}]}, "messages", "messages[0].tool_call_id: required"),
    ({"messages": [{"role": "function", "content": "4"}]}, "messages", "messages[0].role: the legacy"),
    (
        {"messages": [{"role": "user", "content": "a", "tool_calls": [{"id": "1"}]}]},
        "messages",
        "messages[0].tool_calls: only an assistant's",
    ),
    ({"messages": [{"role": "user"}]}, "messages", "messages[0].content: required"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages", "messages[0].content: must be a string"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages",
        "messages[0].content[0]: GPT-2 reads text parts only",
    ),
    (
        {"messages": [{"role": "assistant", "content": "a", "tool_calls": [{"id": "1"}]}]},
        "messages",
        "messages[0].tool_calls[0]: must be",
    ),
    ({"messages": "hi"}, "messages", "valid array"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0]: must be"),
    ({"tools": []}, "tools", "tools: empty"),
    ({"tool_choice": "required"}, "tool_choice", "give tools to choose from"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice", "decides no tool call"),
    (
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
        "tool_choice",
        "decides no tool call",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function"}},
        "tool_choice",
        "tool_choice: None is none of the tools (f)",
    ),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        "response_format",
        "one constraint a request; tool_choice sets one already",
    ),
    ({"functions": [{"name": "f"}]}, "functions", "give tools and a tool_choice"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
    ({"logprob_token_ids": [1], "logprobs": False}, "logprob_token_ids", "needs logprobs set"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
    ({"min_tokens": 5, "max_completion_tokens": 4}, "min_tokens", "more than max_completion_tokens (4)"),
    ({"store": True}, "store", "not stored"),
    ({"audio": {"voice": "x"}}, "audio", "text only"),
    (
        {
            "echo": True,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "required",
        },
        "echo",
        "no content",
    ),
    ({"messages": [{"role": "user", "content": "a", "name": 7}]}, "messages", "messages[0].name: must be"),
]


def checked(change: dict[str, Any], chat: bool = False) -> Any:
    """A request body with `change`, through the route's checks (`parse`, then `check`)."""
    from max_gpt2.serving.api.chat_prompt import checked_messages
    from max_gpt2.serving.api.protocol import ChatRequest, CompletionRequest, parse
    from max_gpt2.serving.api.requests import check
    from max_gpt2.serving.api.token_fields import prompts

    body = parse(
        ChatRequest if chat else CompletionRequest,
        json.dumps({**(CHAT if chat else GOOD), **change}).encode(),
    )
    if chat:
        checked_messages(body.messages)
    else:
        prompts(body.prompt)
    return check(body, VOCAB, CONTEXT)


@pytest.mark.parametrize(
    ("change", "param", "says", "chat"),
    [(*case, False) for case in REFUSED] + [(*case, True) for case in CHAT_REFUSED],
    ids=[str(case[0]) for case in REFUSED + CHAT_REFUSED],
)
def test_each_refusal_names_the_field_and_what_it_may_be(change, param, says, chat):
    from max_gpt2.serving.api.protocol import Refusal

    with pytest.raises(Refusal) as refused:
        checked(change, chat)
    assert refused.value.status == 400
    assert refused.value.param == param
    assert refused.value.message.startswith(param) or refused.value.message.startswith("messages[")
    assert says in refused.value.message


def test_what_clients_send_as_defaults_and_empty_fields_is_taken():
    """OpenAI's default `modalities`, a `top_k` past the vocabulary (all of it, as vLLM), vLLM's beam search
    settings left off (its clients send them so), and a message as the `openai` client dumps it, its empty
    fields included: taken, not refused."""
    assert checked({"modalities": ["text"], "top_k": 2**31}).sampling.top_k == VOCAB
    assert checked({"use_beam_search": False, "length_penalty": 1.0, "early_stopping": False, "best_of": 1})
    dumped = {"role": "assistant", "content": "a", "refusal": None, "tool_calls": [], "annotations": []}
    checked({"messages": [dumped, {"role": "user", "content": "b"}]}, chat=True)


def test_vllms_newer_fields_are_taken_where_they_ask_for_what_is_done():
    """vLLM's fields a client of a newer vLLM sends: no thinking budget (-1), `include_reasoning` and
    `return_token_offsets` (which vLLM reads on no generating route), an empty media setting; and
    `repetition_detection`, off at sizes 0 (as vLLM's default) and read into the choice's rule."""
    from max_gpt2.serving.api.repetition import Repetition

    taken = {"thinking_token_budget": -1, "include_reasoning": False, "return_token_offsets": True}
    assert checked({**taken, "mm_processor_kwargs": {}}, chat=True).rules.repetition is None
    zero = {"max_pattern_size": 0, "min_pattern_size": 0, "min_count": 0}
    assert checked({"repetition_detection": zero}).rules.repetition is None
    rule = checked({"repetition_detection": {"max_pattern_size": 3, "min_count": 2}}).rules.repetition
    assert rule == Repetition(min_size=1, max_size=3, count=2)
    assert checked({"return_prompt_text": True}, chat=True).prompt_text
    written = {"disable_any_whitespace": True, "disable_additional_properties": False}  # what is written
    assert checked({"structured_outputs": {"json": {"type": "object"}, **written}}).constraint is not None
    assert checked({"prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "implicit"}}, chat=True)


def test_llama_servers_own_fields_are_read_as_llama_server_reads_them():
    """What llama-server's clients send on the OpenAI routes: its samplers left off (and their
    parameters), `samplers` turning off what it leaves out, the penalties over the last `repeat_last_n`
    tokens where llama-server's fields ask,
    `max_tokens: -1` for no limit, an empty grammar for none, `sse_ping_interval`."""
    web_page = {
        "mirostat": 0, "mirostat_tau": 5, "typical_p": 1, "dry_multiplier": 0, "dry_base": 1.75,
        "xtc_probability": 0, "xtc_threshold": 0.1, "return_progress": True, "timings_per_token": False,
        "reasoning_format": "auto", "backend_sampling": False, "id_slot": -1, "max_tokens": -1,
    }  # fmt: skip
    asked = checked(web_page, chat=True)
    assert asked.sampling.max_new_tokens is None and asked.constraint is None
    cut = checked(
        {"samplers": "kt", "top_k": 5, "top_p": 0.5, "min_p": 0.2, "grammar": "", "json_schema": {}}
    )
    assert (cut.sampling.top_k, cut.sampling.top_p, cut.sampling.min_p) == (5, 1.0, 0.0)  # "p", "m" out
    assert cut.constraint is None
    vllm = checked({"allowed_token_ids": [5, 3, 5], "spaces_between_special_tokens": False, "priority": 0})
    assert checked({"session_id": "chat-7"}, chat=True).n == 1  # vLLM's routers read it; nothing here
    assert vllm.allowed_ids == (3, 5) and vllm.rules.skip_special and vllm.prompt_cut is None
    assert checked({"truncate_prompt_tokens": -1, "skip_special_tokens": False}).prompt_cut == slice(
        -CONTEXT, None
    )
    assert checked({"truncate_prompt_tokens": 20, "truncation_side": "right"}).prompt_cut == slice(20)
    spelled = checked({"samplers": ["TOP-K", "temp", "nucleus"], "top_k": 5, "top_p": 0.5, "min_p": 0.2})
    assert (spelled.sampling.top_k, spelled.sampling.top_p, spelled.sampling.min_p) == (5, 0.5, 0.0)
    assert checked({"adaptive_target": 0.5}).picker is None  # not in the default chain: it does nothing
    penalty = checked({"repeat_penalty": 1.2, "repeat_last_n": -1, "sse_ping_interval": 2})
    assert penalty.sampling.repetition_penalty == 1.2 and penalty.ping_s == 2
    assert penalty.penalty_last_n == CONTEXT  # -1: the whole context, as llama-server reads it
    windows = [checked(body).penalty_last_n for body in ({"repeat_penalty": 1.2}, {"repeat_last_n": 0}, {})]
    assert windows == [64, 0, None]  # llama-server's default; none counted; Hugging Face's and OpenAI's way
    from max.pipelines.context.sampling_params import SamplingParamsGenerationConfigDefaults

    defaults = SamplingParamsGenerationConfigDefaults()
    made = checked({"repeat_penalty": 1.2, "repeat_last_n": 7}).request("r", "gpt2", "x", 0, defaults, 0, "/")
    assert made.penalty_last_n == 7 and made.sampling_params.repetition_penalty == 1.2
    # vLLM's `prompt_logprobs`: the prompt's log-probabilities, ranked, the most alternatives either asks
    ranked = checked({"prompt_logprobs": 3, "logprobs": 1}).request("r", "gpt2", "x", 0, defaults, 0, "/")
    assert (ranked.logprobs, ranked.echo, ranked.prompt_ranks) == (3, True, True)
    bare = checked({"prompt_logprobs": 0}, chat=True).request("r", "gpt2", "x", 0, defaults, 0, "/")
    assert (bare.logprobs, bare.echo, bare.prompt_ranks) == (1, True, True)  # MAX reads 0 as none
    assert (made.logprobs, made.echo, made.prompt_ranks) == (0, False, False)
    assert checked({"prompt_logprobs": 0, "stream": True}).prompt_logprobs is None  # vLLM's: nothing shown
    listing = checked({"logprob_token_ids": [3, 3, 1], "logprobs": 0}).request(
        "r", "gpt2", "x", 0, defaults, 0, "/"
    )
    assert (listing.logprob_ids, listing.logprobs, made.logprob_ids) == ((3, 1), 1, None)


def test_what_is_honoured_goes_on_to_max_meaning_the_same():
    """Sampling values as given; each choice of a seeded request a seed of its own (so `n` seeded samples
    differ, and repeat); `seed: 0` a seed too (MAX takes 0 as "pick one"); biases by id; stop rules."""
    from max.pipelines.context.sampling_params import SamplingParamsGenerationConfigDefaults

    from max_gpt2.serving.api.requests import FIXED_SEED_ZERO

    defaults = SamplingParamsGenerationConfigDefaults()
    asked = checked(
        {
            "temperature": 0.7, "top_k": 5, "repetition_penalty": 1.2, "stop": "\n", "user": "u", "n": 3,
            "seed": 11, "logit_bias": {"7": -100, "9": 2.5}, "min_tokens": 2, "logprobs": 0,
            "include_stop_str_in_output": True, "stop_token_ids": [4],
        }
    )  # fmt: skip
    requests = [asked.request("r", "gpt2", "The cat", i, defaults, 0, "/v1/completions") for i in range(3)]
    assert [request.sampling_params.seed for request in requests] == [11, 12, 13]
    params = requests[0].sampling_params
    assert (params.temperature, params.top_k, params.repetition_penalty, params.max_new_tokens) == (
        0.7,
        5,
        1.2,
        4,
    )
    assert requests[0].logit_bias == {7: -100.0, 9: 2.5} and requests[0].logprobs == 1  # MAX reads 0 as none
    assert (asked.rules.stop, asked.rules.keep, asked.rules.min_tokens) == (("\n",), True, 2)
    assert asked.rules.stop_token_ids == {4} and asked.logprobs == 0 and asked.n == 3
    zero = checked({"seed": 0}).request("r", "gpt2", "x", 0, defaults, 0, "/")
    assert zero.sampling_params.seed == FIXED_SEED_ZERO
    last = checked({"seed": 2**64 - 1, "n": 2}).request("r", "gpt2", "x", 1, defaults, 0, "/")
    assert last.sampling_params.seed == FIXED_SEED_ZERO  # wraps to 0, which is a seed too
    assert checked({"suffix": "", "logit_bias": {}, "n": None}).n == 1  # empty values ask nothing
    # llama-server's forms: `[id, bias]` pairs, `false` a ban (as `ban` bans), and `seed: -1` no seed.
    banned = checked({"logit_bias": [[7, -5], ["9", False]]}).logit_bias
    assert banned == {7: -5.0, 9: LOWEST} and checked({"logit_bias": {"9": False}}).logit_bias == {9: LOWEST}
    random = checked({"seed": -1})
    seeds = {random.request("r", "gpt2", "x", 0, defaults, 0, "/").sampling_params.seed for _ in range(4)}
    assert random.sampling.seed is None and len(seeds) == 4  # MAX draws 32 random bits a request
    chat = checked({"logprobs": True, "max_completion_tokens": 3, "max_tokens": 9}, chat=True)
    assert chat.logprobs == 0 and chat.sampling.max_new_tokens == 3


def hugging_face_repetition(row, seen, penalty):
    """`RepetitionPenaltyLogitsProcessor`, one id at a time."""
    row = row.astype(np.float64)
    for token in set(seen):
        row[token] = row[token] * penalty if row[token] < 0 else row[token] / penalty
    return row


def openai_penalties(row, generated, frequency, presence):
    """OpenAI's formula: logit - count * frequency_penalty - (count > 0) * presence_penalty."""
    row = row.astype(np.float64)
    for token in set(generated):
        row[token] -= generated.count(token) * frequency + presence
    return row


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    repetition=st.floats(0.5, 3.0),
    frequency=st.floats(-2.0, 2.0),
    presence=st.floats(-2.0, 2.0),
)
def test_penalties_are_hugging_faces_repetition_then_openais(seed, repetition, frequency, presence):
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(50).astype(np.float32) * 4
    prompt = rng.integers(0, 50, 6).tolist()
    generated = rng.integers(0, 50, rng.integers(0, 9)).tolist()
    expected = openai_penalties(
        hugging_face_repetition(row, prompt + generated, repetition), generated, frequency, presence
    )
    seen = token_counts(prompt + generated, 50) > 0
    got = penalize(row, seen, token_counts(generated, 50), repetition, frequency, presence)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)
    assert got is not row and np.array_equal(row, row.astype(np.float32))  # the input is left alone


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 19), max_size=30), n=st.integers(0, 40))
def test_llama_cpps_window_counts_the_last_n_ids(ids, n):
    expected = np.zeros(20, np.int64)
    for token in ids[max(0, len(ids) - n) :] if n else []:  # llama.cpp's ring of its last n tokens
        expected[token] += 1
    np.testing.assert_array_equal(last_counts(ids, n, 20), expected)


def test_banned_ids_are_never_the_argmax_and_ids_outside_the_row_are_ignored():
    row = np.arange(10, dtype=np.float32)
    banned = ban(row, [9, 8, 42])
    assert banned[9] == banned[8] == LOWEST and int(np.argmax(banned)) == 7
    np.testing.assert_array_equal(banned[:8], row[:8])


def guarded_client(
    api_key: str | None, explorer: Any = None, origins: tuple[str, ...] = (), pooling: Pooling | None = None
):
    """A bare Starlette app with our routes and guard mounted as on MAX's (`routes.mount`), its engine a
    stand-in whose tokenizer knows only LM's shapes (no route here runs a model), through Starlette's
    test client; with `pooling`, a server of embeddings'."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from max_gpt2.serving.api.routes import mount
    from max_gpt2.serving.settings import ServingSettings
    from max_gpt2.serving.tokenizer import GPT2EmbeddingsTokenizer, GPT2TextTokenizer

    kind = GPT2TextTokenizer if pooling is None else GPT2EmbeddingsTokenizer
    tokenizer = kind.__new__(kind)  # only its shapes, no files read
    tokenizer.model_vocab_size, tokenizer.n_positions, tokenizer.n_embd = VOCAB, CONTEXT, 60
    app = Starlette()
    app.state.pipeline = type("Engine", (), {"tokenizer": tokenizer})()
    app.state.pipeline_config = None
    settings = ServingSettings(served_names=("gpt2", "other"), allowed_origins=origins, pooling=pooling)
    mount(app, settings, api_key, explorer)
    return TestClient(app)


def test_a_slots_action_is_answered_as_llama_server_without_a_save_path_answers_it():
    """A 501, llama-server's `not_supported_error`: MAX's prefix cache has no slot's prompt to save."""
    for action in ("save", "restore", "erase"):
        answer = guarded_client(None).post(f"/slots/0?action={action}", json={"filename": "a.bin"})
        assert answer.status_code == 501, answer.json()
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("not_supported_error", 501) and "prefix cache" in error[
            "message"
        ]
    on_embeddings = guarded_client(None, pooling=Pooling.LAST).get("/slots")
    assert on_embeddings.status_code == 404 and "--embeddings" in on_embeddings.json()["error"]["message"]


def test_an_api_key_is_asked_of_every_request_but_health():
    client = guarded_client("s3cret")
    refused = client.post("/v1/completions", json=GOOD)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["type"] == "authentication_error"
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Basic s3cret"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert (
        client.get("/health").json() == client.get("/v1/health").json() == {"status": "ok"}
    )  # llama-server's
    assert guarded_client(None).get("/v1/models").status_code == 200


def test_routes_gpt2_cannot_answer_are_refused_with_openais_body():
    client = guarded_client(None)
    embeddings = client.post("/v1/embeddings", json={"model": "gpt2", "input": "hi"})
    assert embeddings.status_code == 404
    said = embeddings.json()["error"]["message"]
    assert "/v1/chat/completions" in said and "a server started with --embeddings" in said
    reranked = client.post("/v1/rerank", json={"query": "a", "documents": ["b"]}).json()["error"]["message"]
    assert "a server started with --embeddings" in reranked and "reranks texts by them" in reranked
    llamas = client.post("/reranking", json={"query": "a", "documents": ["b"]}).json()["error"]["message"]
    assert "reranking model's head" in llamas
    not_allowed = client.get("/v1/completions")
    assert not_allowed.status_code == 405 and not_allowed.headers["allow"] == "POST"  # HTTP asks for it
    assert "answers POST, not GET" in client.get("/tokenize").json()["error"]["message"]


def test_every_served_name_is_listed_and_answers_and_others_are_404s():
    client = guarded_client(None)
    listed = client.get("/v1/models").json()
    assert [model["id"] for model in listed["data"]] == ["gpt2", "other"]
    assert all(model["max_model_len"] == 48 for model in listed["data"])
    assert client.get("/v1/models/other").json()["id"] == "other"
    assert client.get("/v1/models/").status_code == 404  # names no model: not the first one's card
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    wrong_model = client.post("/v1/completions", json={**GOOD, "model": "gpt-4"})
    assert (
        wrong_model.status_code == 404 and "serves 'gpt2', 'other'" in wrong_model.json()["error"]["message"]
    )


def test_cors_is_off_by_default_and_a_preflight_needs_no_key_where_origins_are_allowed():
    """With `--allowed-origins`, a browser's preflight is answered without the key, and the request
    itself still needs it (its 401 readable by the page); without, no CORS header at all."""
    page = "http://page.example"
    preflight = {
        "Origin": page,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    allowed = guarded_client("s3cret", origins=(page,))
    answered = allowed.options("/v1/completions", headers=preflight)
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == page
    assert "authorization" in answered.headers["access-control-allow-headers"].lower()
    refused = allowed.get("/v1/models", headers={"Origin": page})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page
    keyed = allowed.get("/v1/models", headers={"Origin": page, "Authorization": "Bearer s3cret"})
    assert keyed.status_code == 200 and keyed.headers["access-control-allow-origin"] == page
    assert (
        "access-control-allow-origin"
        not in allowed.options("/v1/models", headers={**preflight, "Origin": "http://evil.example"}).headers
    )
    off = guarded_client(None)
    for answer in (
        off.options("/v1/completions", headers=preflight),
        off.get("/v1/models", headers={"Origin": page}),
    ):
        assert "access-control-allow-origin" not in answer.headers


def test_a_server_of_embeddings_answers_embeddings_and_no_generating_route():
    client = guarded_client(None, pooling=Pooling.MEAN)
    for path in ("/v1/completions", "/v1/chat/completions", "/completion", "/v1/responses", "/v1/messages"):
        refused = client.post(path, json=GOOD)
        assert refused.status_code == 404, path
        assert "was started with --embeddings and generates no text" in refused.json()["error"]["message"]
    assert client.get("/tokenize").status_code == 405  # served, for POST
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == CONTEXT
    pooling = client.post("/pooling", json={"input": "hi"}).json()["error"]["message"]
    assert "answers POST /v1/embeddings, OpenAI's, and llama-server's /embedding" in pooling


EMBEDDING = {"model": "gpt2", "input": [[1, 2, 3]]}
# A bad field of an embeddings request, and what the refusal must say (checked before the model runs).
EMBEDDING_REFUSED = [
    ({"input": []}, "input", "input: the list holds nothing"),
    ({"input": [[1], []]}, "input", "input[1]: empty; GPT-2 needs at least one token"),
    (
        {"input": [[1, VOCAB]]},
        "input",
        f"input: token id {VOCAB} at position 1 is outside the model's vocabulary of {VOCAB}",
    ),
    ({"input": None}, "input", "input: required (input: texts or token ids; messages: a chat"),
    ({"input": [[1]] * 2049}, "input", "at most 2048 inputs a request"),
    ({"input": {"text": "a"}}, "input", "input: must be a string or a list"),
    (
        {"input": [1] * (CONTEXT + 1)},
        "input",
        f"maximum context length is {CONTEXT} tokens, however you requested",
    ),
    ({"dimensions": 8}, "dimensions", "GPT-2's embeddings have 60"),
    ({"encoding_format": "binary"}, "encoding_format", "'float', 'base64', 'bytes' or 'bytes_only'"),
    ({"embed_dtype": "int8", "encoding_format": "base64"}, "embed_dtype", "'float32', 'float16', 'bfloat16'"),
    ({"endianness": "middle", "encoding_format": "bytes"}, "endianness", "'native', 'big' or 'little'"),
    ({"embed_dtype": "float16"}, "embed_dtype", "embed_dtype: for encoding_format base64 or bytes"),
    ({"endianness": "big"}, "endianness", "endianness: for encoding_format base64 or bytes"),
    (
        {"truncate_prompt_tokens": 0},
        "truncate_prompt_tokens",
        f"-1 (the context's {CONTEXT}) or 1 to {CONTEXT}",
    ),
    ({"truncate_prompt_tokens": CONTEXT + 1}, "truncate_prompt_tokens", "got 49"),
    ({"embd_normalize": -2}, "embd_normalize", "-1 (none), 0 (largest value to 32760)"),
    ({"embd_normalize": 1, "normalize": True}, "embd_normalize", "says otherwise than normalize: True"),
    ({"pooling_type": "cls"}, "pooling_type", "not a field this route takes"),
    ({"model": "gpt3"}, "model", "'gpt3' is not served here"),
]


@pytest.mark.parametrize(("change", "field", "says"), EMBEDDING_REFUSED)
def test_an_embeddings_request_is_refused_naming_its_field(change, field, says):
    answer = guarded_client(None, pooling=Pooling.LAST).post("/v1/embeddings", json={**EMBEDDING, **change})
    assert answer.status_code == (404 if field == "model" else 400), answer.json()
    error = answer.json()["error"]
    assert error["param"] == field and says in error["message"], error
    if "context length" in says:
        assert error["code"] == "context_length_exceeded"


def serve_arguments(*options: str) -> argparse.Namespace:
    from max_gpt2.cli import build_parser

    return build_parser().parse_args(["serve", *options])


def test_the_api_key_reaches_the_server_in_its_environment_never_its_command_line(lm_checkpoint, monkeypatch):
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.outputs import Progress
    from max_gpt2.serving.settings import API_KEY_VARIABLE
    from tests.support import LM

    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    checkpoint = str(lm_checkpoint(LM))
    command, env = serve_command(
        serve_arguments("--checkpoint", checkpoint, "--api-key", "k1"), Progress(io.StringIO())
    )
    assert env[API_KEY_VARIABLE] == "k1" and not any("k1" in part for part in command)
    assert command[1:3] == ["-m", "max_gpt2.cli.serve_process"]
    monkeypatch.setenv(API_KEY_VARIABLE, "from-env")
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint), Progress(io.StringIO()))
    assert env[API_KEY_VARIABLE] == "from-env"
    monkeypatch.delenv(API_KEY_VARIABLE)
    said = io.StringIO()
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint), Progress(said))
    assert API_KEY_VARIABLE not in env and "warning" not in said.getvalue()
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint, "--host", "0.0.0.0"), Progress(said))
    assert "warning: --host 0.0.0.0 lets other machines reach the model, and no --api-key" in said.getvalue()


def test_only_loopback_hosts_count_as_private():
    from max_gpt2.cli.console import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "127.3.2.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.4", "example.com", "::"]))


def test_the_explorer_answers_under_explore_once_its_model_loads_and_the_api_serves_on(lm_checkpoint):
    from max_gpt2.explorer.loading import ExplorerSettings, LoadingExplorer
    from max_gpt2.serving.api.guard import EXPLORER
    from tests.support import LM

    explorer = LoadingExplorer(ExplorerSettings(str(lm_checkpoint(LM)), "cpu", "float32", None), EXPLORER)
    client = guarded_client(None, explorer=explorer)
    deadline = time.monotonic() + 600
    while (answer := client.post("/explore/api/explore", json={"text": "The cat sat"})).status_code == 503:
        assert "still loading" in answer.json()["error"] and time.monotonic() < deadline
        time.sleep(0.5)
    assert answer.status_code == 200 and answer.json()["text"] == "The cat sat"
    assert answer.headers["cache-control"] == "no-store"
    page = client.get("/explore/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '"api": "/explore"' in page.text
    layer = client.get("/explore/api/map", params={"id": answer.json()["id"], "layer": 0, "head": 1})
    assert layer.status_code == 200 and layer.json()["size"] == len(answer.json()["tokens"])
    empty = client.post("/explore/api/explore", json={"text": ""})
    assert empty.status_code == 400 and empty.json() == {"error": "the text is empty: type or paste some"}
    assert client.get("/v1/models").status_code == 200
    assert client.get("/explorer").status_code == 404  # only /explore and under it


def test_an_explorer_that_cannot_load_says_why_and_the_api_serves_on(tmp_path):
    from max_gpt2.explorer.loading import ExplorerSettings, LoadingExplorer
    from max_gpt2.serving.api.guard import EXPLORER

    explorer = LoadingExplorer(ExplorerSettings(str(tmp_path / "gone"), "cpu", "float32", None), EXPLORER)
    client = guarded_client(None, explorer=explorer)
    deadline = time.monotonic() + 60
    assert client.get("/explore/").status_code == 200  # the page, at once
    while (answer := client.get("/explore/api/map")).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answer.status_code == 500
    assert answer.json()["error"].startswith("the explorer's model did not load: ")
    assert str(tmp_path / "gone") in answer.json()["error"]
    assert client.get("/v1/models").status_code == 200


def test_serve_explorer_passes_its_load_to_the_server_and_refuses_an_api_key(lm_checkpoint, monkeypatch):
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.explorer.loading import ExplorerSettings
    from max_gpt2.outputs import Progress
    from max_gpt2.serving.settings import API_KEY_VARIABLE, VARIABLE, ServingSettings
    from tests.support import LM

    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    checkpoint = str(lm_checkpoint(LM))
    options = ("--checkpoint", checkpoint, "--explorer", "--weight-format", "q8_0")
    _, env = serve_command(serve_arguments(*options), Progress(io.StringIO()))
    explorer = ServingSettings.from_json(env[VARIABLE]).explorer
    assert ExplorerSettings.from_json(explorer) == ExplorerSettings(checkpoint, "auto", "float32", "q8_0")
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint), Progress(io.StringIO()))
    assert ServingSettings.from_json(env[VARIABLE]).explorer is None
    with pytest.raises(ValueError, match="--explorer: the explorer's page cannot send an API key"):
        serve_command(serve_arguments(*options, "--api-key", "k"), Progress(io.StringIO()))


def test_serve_hands_names_origins_and_a_chat_template_to_the_server(lm_checkpoint, monkeypatch, tmp_path):
    """Several names (MAX's own option takes one: the first), origins in vLLM's JSON and llama-server's
    comma-separated spellings, a built-in chat template by name or a file of one, and MAX's telemetry
    off unless asked for."""
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.outputs import Progress
    from max_gpt2.serving.chat_templates import TEMPLATES
    from max_gpt2.serving.settings import API_KEY_VARIABLE, VARIABLE, ServingSettings
    from tests.support import LM

    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    monkeypatch.setenv("MAX_SERVE_DISABLE_TELEMETRY", "0")
    options = (
        "--checkpoint", str(lm_checkpoint(LM)), "--served-model-name", "gpt2", "gpt2-small",
        "--allowed-origins", '["http://a.example"]', "--cors-origins", "http://b.example, http://c.example",
        "--chat-template", "chatml",
    )  # fmt: skip
    command, env = serve_command(serve_arguments(*options), Progress(io.StringIO()))
    settings = ServingSettings.from_json(env[VARIABLE])
    assert settings.served_names == ("gpt2", "gpt2-small") and "--served-model-name=gpt2" in command
    assert settings.allowed_origins == ("http://a.example", "http://b.example", "http://c.example")
    assert f"--chat-template={TEMPLATES / 'chatml.jinja'}" in command
    assert env["MAX_SERVE_DISABLE_TELEMETRY"] == "1"
    own = tmp_path / "template.jinja"
    own.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    command, env = serve_command(
        serve_arguments(*options[:2], "--chat-template", str(own), "--telemetry"), Progress(io.StringIO())
    )
    assert f"--chat-template={own}" in command and env["MAX_SERVE_DISABLE_TELEMETRY"] == "0"  # the user's


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--host", "127.0.0.1,::1"), "--host 127.0.0.1,::1: one address to listen on"),
        (("--host", "no-such-host.invalid"), "--host no-such-host.invalid: "),
        (
            ("--chat-template", "nothing-here.jinja"),
            "--chat-template nothing-here.jinja: no such file, nor a built-in",
        ),
        (("--chat-template", "BROKEN"), "line 1: "),
        (("--allowed-origins", "[1]"), "origins are strings"),
    ],
)
def test_serve_refuses_bad_options_before_loading(options, says, lm_checkpoint, tmp_path):
    """Each refused at once, naming the option, with exit status 2: nothing has loaded."""
    from tests.support import LM, run_python

    if "BROKEN" in options:
        broken = tmp_path / "broken.jinja"
        broken.write_text("{% for m in messages %}{{ m['content'] }")
        options = (options[0], str(broken))
    result = run_python("-m", "max_gpt2", "serve", "--checkpoint", lm_checkpoint(LM), *options)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


def test_serve_embeddings_runs_maxs_embeddings_pipeline_pooling_as_asked(lm_checkpoint):
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.outputs import Progress
    from max_gpt2.serving.settings import VARIABLE, ServingSettings
    from tests.support import LM

    checkpoint = str(lm_checkpoint(LM))

    def started(*options: str) -> tuple[list[str], ServingSettings]:
        command, env = serve_command(
            serve_arguments("--checkpoint", checkpoint, *options), Progress(io.StringIO())
        )
        return command, ServingSettings.from_json(env[VARIABLE])

    command, settings = started("--embeddings", "--pooling", "mean")
    assert "--task=embeddings_generation" in command and "--max-batch-size=16" in command
    assert "--enable-echo" not in command and settings.pooling is Pooling.MEAN
    assert started("--embeddings", "--max-batch-size", "3")[0][-1] == "--max-batch-size=3"
    assert started("--embeddings")[1].pooling is Pooling.LAST
    command, settings = started()
    assert "--task=text_generation" in command and settings.pooling is None
    for options, says in (
        (("--pooling", "mean"), "--pooling mean: pools embeddings; give --embeddings too"),
        (("--embeddings", "--prompt-lookup", "4"), "--prompt-lookup 4: sets how text is generated"),
        (("--embeddings", "--decode-steps", "2"), "--decode-steps 2: sets how text is generated"),
    ):
        with pytest.raises(ValueError, match=says):
            started(*options)


def test_a_context_refusal_names_its_field_and_room_and_crosses_processes_as_made():
    import pickle

    from max_gpt2.serving.tokenizer import ContextExceeded

    generating, embedding = (
        ContextExceeded(CONTEXT, CONTEXT),
        ContextExceeded(CONTEXT + 1, CONTEXT, "input[2]", 0),
    )
    assert str(generating).startswith(f"prompt: This model's maximum context length is {CONTEXT} tokens")
    assert "no room for a new one" in str(generating) and "no room" not in str(embedding)
    assert str(embedding).startswith("input[2]:") and embedding.fields["n_prompt_tokens"] == CONTEXT + 1
    for error in (generating, embedding):
        again = pickle.loads(pickle.dumps(error))
        assert (str(again), again.fields) == (str(error), error.fields)
