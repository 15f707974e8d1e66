"""vLLM's own fields on the OpenAI routes, through the real server (`max_gpt2.serving.api.vllm_fields`):
`allowed_token_ids` (the tokens this test's loop takes from the served weights' logits over those ids
alone), `skip_special_tokens: false` (the text Hugging Face's `decode` writes with its special
tokens), `truncate_prompt_tokens` (the prompt's last tokens, a prompt past the context included),
`return_tokens_as_token_ids` and `request_id`. Their refusals, which need no model: test_serve_guard.py."""

from __future__ import annotations

import numpy as np

from max_gpt2.inference.tokenizer import END_OF_TEXT
from tests.support import LM, requires_serving
from tests.test_serve import PROMPTS, client
from tests.test_serve_native import greedy, post

pytestmark = requires_serving()

GREEDY = {"temperature": 0, "ignore_eos": True, "return_token_ids": True}


def test_allowed_token_ids_leave_only_those_ids_to_come(served_lm, served_model, served_tokenizer):
    prompt = served_tokenizer.encode(PROMPTS[0]).ids
    plain, _ = greedy(served_model, served_tokenizer, prompt, 8)
    allowed = sorted({7, 42, 99, 150, 200, 250} - set(plain))  # none of the plain choices
    ids = list(prompt)
    for _ in range(8):
        row = served_model.logits(np.array([ids]))[0, -1]
        ids.append(allowed[int(np.argmax(row[allowed]))])
    for path, body in (
        ("/v1/completions", {"prompt": prompt, "max_tokens": 8}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 8}),
    ):
        status, answer = post(served_lm, path, {**body, **GREEDY, "allowed_token_ids": allowed})
        assert status == 200, answer
        made = answer["choices"][0]["token_ids"]
        assert set(made) <= set(allowed) and (
            path != "/v1/completions" or made == ids[len(prompt) :] != plain
        )


def vllm_word_ids(tokenizer, word: str) -> list[list[int]]:
    """vLLM's ids for a bad word: as it begins a text, and after a space where that gives as many
    tokens, the first another."""
    bare = tokenizer.encode(word.lstrip(), add_special_tokens=False).ids
    spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False).ids
    return [bare, *([spaced] if len(spaced) == len(bare) and spaced[0] != bare[0] else [])]


def test_bad_words_never_come_as_vllm_bans_them(served_lm, served_model, served_tokenizer):
    """A word of two tokens of the plain greedy text (its first still free to come), and one of one token
    where one decodes: each step's argmax, a word's last token banned where the text so far ends with
    the rest of it (the prompt not counted), is the served text, and differs from the plain one."""
    prompt = served_tokenizer.encode("Once upon a time").ids  # random weights: text that re-encodes
    plain, _ = greedy(served_model, served_tokenizer, prompt, 8)

    def word(start: int, size: int) -> str | None:  # the text of plain's tokens there, where it bans them
        text = served_tokenizer.decode(plain[start : start + size])
        return text if plain[start : start + size] in vllm_word_ids(served_tokenizer, text) else None

    two = next(found for i in range(7) if (found := word(i, 2)))
    ones = [found for j in range(8) if (found := word(j, 1)) and plain[j] not in plain[:2]]
    words = [two, *ones[:1]]
    banned = [ids for text in words for ids in vllm_word_ids(served_tokenizer, text)]
    ids = list(prompt)
    for _ in range(8):
        row = served_model.logits(np.array([ids]))[0, -1]
        made = ids[len(prompt) :]
        for each in banned:
            if len(each) == 1 or made[-(len(each) - 1) :] == each[:-1]:
                row[each[-1]] = -np.inf
        ids.append(int(np.argmax(row)))
    body = {"prompt": prompt, "max_tokens": 8, **GREEDY, "bad_words": words}
    status, answer = post(served_lm, "/v1/completions", body)
    assert status == 200, answer
    assert answer["choices"][0]["token_ids"] == ids[len(prompt) :] != plain
    status, answer = post(served_lm, "/v1/completions", {**body, "bad_words": ["fine", " "]})
    assert status == 400 and answer["error"]["param"] == "bad_words", answer
    assert "bad_words[1]: no word" in answer["error"]["message"]


def test_special_tokens_are_written_where_skip_special_tokens_is_false(served_lm, served_tokenizer):
    eos = served_tokenizer.token_to_id(END_OF_TEXT)
    body = {"prompt": PROMPTS[0], "max_tokens": 5, **GREEDY, "logit_bias": {str(eos): 100}}
    skipped = post(served_lm, "/v1/completions", body)[1]["choices"][0]
    written = post(served_lm, "/v1/completions", {**body, "skip_special_tokens": False})[1]["choices"][0]
    assert skipped["token_ids"] == written["token_ids"] == [eos] * 5
    assert skipped["text"] == "" and written["text"] == END_OF_TEXT * 5
    assert written["text"] == served_tokenizer.decode(written["token_ids"], skip_special_tokens=False)
    # Ended by end-of-text (ignore_eos off), its own text is left out unless include_stop_str_in_output.
    ended = {**body, "ignore_eos": False, "skip_special_tokens": False}
    assert post(served_lm, "/v1/completions", ended)[1]["choices"][0]["text"] == ""
    kept = post(served_lm, "/v1/completions", {**ended, "include_stop_str_in_output": True})[1]
    assert kept["choices"][0]["text"] == END_OF_TEXT and kept["choices"][0]["finish_reason"] == "stop"


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(served_lm, served_model, served_tokenizer):
    long = served_tokenizer.encode(" ".join(PROMPTS) * 12).ids
    assert len(long) > LM.n_positions
    last = long[-20:]
    ids, _ = greedy(served_model, served_tokenizer, last, 6)
    for prompt in (long, served_tokenizer.decode(long)):
        body = {"prompt": prompt, "max_tokens": 6, **GREEDY, "truncate_prompt_tokens": 20}
        status, answer = post(served_lm, "/v1/completions", body)
        assert status == 200 and answer["choices"][0]["token_ids"] == ids, answer
        assert answer["choices"][0]["prompt_token_ids"] == last and answer["usage"]["prompt_tokens"] == 20
    status, refused = post(served_lm, "/v1/completions", {"prompt": long, "max_tokens": 6})
    assert status == 400 and refused["error"]["param"] == "prompt"
    first, _ = greedy(served_model, served_tokenizer, long[:20], 6)  # vLLM's `truncation_side: "right"`
    body = {
        "prompt": long,
        "max_tokens": 6,
        **GREEDY,
        "truncate_prompt_tokens": 20,
        "truncation_side": "right",
    }
    choice = post(served_lm, "/v1/completions", body)[1]["choices"][0]
    assert (choice["prompt_token_ids"], choice["token_ids"]) == (long[:20], first)


def test_repetition_detection_ends_a_choice_where_its_tokens_repeat(
    served_lm, served_model, served_tokenizer
):
    """vLLM's `repetition_detection`: with one token allowed, a choice ends ("repetition") once it came
    `min_count` times, or `min_tokens`; the model's greedy choice between two tokens ends where the
    reference (tests/test_repetition.py) first finds a pattern of 2 to 3 tokens twice at its end, or at
    its length where it finds none; streamed and in a chat alike."""
    from tests.test_repetition import repeats

    once = {
        **GREEDY,
        "allowed_token_ids": [7],
        "repetition_detection": {"max_pattern_size": 1, "min_count": 3},
    }
    for extra, made in (({}, 3), ({"min_tokens": 5}, 5)):
        body = {"prompt": PROMPTS[0], "max_tokens": 12, **once, **extra}
        choice = post(served_lm, "/v1/completions", body)[1]["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("repetition", "repetition_detected")
        assert choice["token_ids"] == [7] * made
    chat = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 12, **once}
    choice = post(served_lm, "/v1/chat/completions", chat)[1]["choices"][0]
    assert (choice["finish_reason"], choice["token_ids"]) == ("repetition", [7, 7, 7])
    prompt, allowed = served_tokenizer.encode(PROMPTS[1]).ids, [7, 42]
    ids = list(prompt)
    for _ in range(16):
        ids.append(allowed[int(np.argmax(served_model.logits(np.array([ids]))[0, -1][allowed]))])
    made = ids[len(prompt) :]
    end = next((k for k in range(1, 17) if repeats(made[:k], 2, 3, 2)), None)
    rule = {"max_pattern_size": 3, "min_pattern_size": 2, "min_count": 2}
    extra = {**GREEDY, "allowed_token_ids": allowed, "repetition_detection": rule}
    stream = client(served_lm).completions.create(
        model="gpt2", prompt=prompt, max_tokens=16, stream=True, extra_body=extra
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    assert [token for chunk in chunks for token in chunk.model_extra["token_ids"]] == made[:end]
    assert chunks[-1].finish_reason == ("length" if end is None else "repetition")


def test_chat_return_prompt_text_is_the_rendered_messages(served_lm, served_tokenizer):
    """vLLM's `return_prompt_text`: the chat template's text (Jinja's, here) beside the answer, whose prompt
    ids are its tokens; streamed, on the first event alone."""
    from tests.test_serve_api import render

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[2]}]
    body = {"messages": messages, "max_tokens": 3, **GREEDY, "return_prompt_text": True}
    answer = post(served_lm, "/v1/chat/completions", body)[1]
    assert answer["prompt_text"] == render(messages)
    assert served_tokenizer.encode(answer["prompt_text"]).ids == answer["choices"][0]["prompt_token_ids"]
    assert (
        "prompt_text" not in post(served_lm, "/v1/chat/completions", {**body, "return_prompt_text": False})[1]
    )
    stream = client(served_lm).chat.completions.create(
        model="gpt2",
        messages=messages,
        max_tokens=3,
        stream=True,
        extra_body={**GREEDY, "return_prompt_text": True},
    )
    texts = [chunk.model_extra.get("prompt_text") for chunk in stream]
    assert texts[0] == render(messages) and not any(texts[1:])


def test_tokens_as_token_ids_and_the_answers_id(served_lm):
    body = {
        "prompt": PROMPTS[1],
        "max_tokens": 4,
        **GREEDY,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    answer = post(served_lm, "/v1/completions", {**body, "request_id": "mine-1"})[1]
    choice = answer["choices"][0]
    assert answer["id"] == "cmpl-mine-1"
    assert choice["logprobs"]["tokens"] == [f"token_id:{token}" for token in choice["token_ids"]]
    assert all(key.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for key in top)
    chat = {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 3, **GREEDY}
    chat |= {"logprobs": True, "top_logprobs": 1, "return_tokens_as_token_ids": True, "request_id": "mine-2"}
    answer = post(served_lm, "/v1/chat/completions", chat)[1]
    entries = answer["choices"][0]["logprobs"]["content"]
    assert answer["id"] == "chatcmpl-mine-2"
    assert [entry["token"] for entry in entries] == [
        f"token_id:{t}" for t in answer["choices"][0]["token_ids"]
    ]
    assert all(bytes(entry["bytes"]).decode() == entry["token"] for entry in entries)


def test_chat_echo_puts_the_last_message_before_the_answer_where_their_roles_match(served_lm):
    """vLLM's chat `echo`: an assistant's last message (continued, or closed by a new turn) is put before
    the answer, whole or streamed; a user's last message is not (the answer's role is the assistant's)."""
    from tests.test_serve import client

    last = {"role": "assistant", "content": [{"type": "text", "text": "The cat"}]}
    continued = {"add_generation_prompt": False, "continue_final_message": True}
    for messages, extra, before in (
        ([{"role": "user", "content": PROMPTS[0]}, last], continued, "The cat"),
        ([{"role": "user", "content": PROMPTS[0]}, last], {}, "The cat"),
        ([{"role": "user", "content": PROMPTS[0]}], {}, ""),
    ):
        body = {"messages": messages, "max_tokens": 4, "temperature": 0, **extra}
        plain = post(served_lm, "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
        echoed = post(served_lm, "/v1/chat/completions", {**body, "echo": True})[1]["choices"][0]["message"]
        assert echoed["content"] == before + plain, (echoed, plain)
        stream = client(served_lm).chat.completions.create(
            model="gpt2", stream=True, **{k: body[k] for k in ("messages", "max_tokens", "temperature")},
            extra_body={**extra, "echo": True},
        )  # fmt: skip
        assert (
            "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            == echoed["content"]
        )


def test_stream_interval_sends_its_tokens_n_an_event_the_first_and_last_alone(served_lm):
    """vLLM's `stream_interval: 4`: 11 tokens come as 1, 4, 4 and the last 2 with the finish, the text and
    ids those of the same request unstreamed; taken unstreamed, and below 1 refused (test_serve_guard)."""
    extra = {**GREEDY, "stream_interval": 4}
    whole = (
        client(served_lm)
        .completions.create(model="gpt2", prompt=PROMPTS[2], max_tokens=11, extra_body=extra)
        .choices[0]
    )
    stream = client(served_lm).completions.create(
        model="gpt2", prompt=PROMPTS[2], max_tokens=11, stream=True, extra_body=extra
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    assert [len(chunk.model_extra["token_ids"]) for chunk in chunks] == [1, 4, 4, 2]
    assert chunks[-1].finish_reason == "length" and all(chunk.finish_reason is None for chunk in chunks[:-1])
    assert [token for chunk in chunks for token in chunk.model_extra["token_ids"]] == whole.model_extra[
        "token_ids"
    ]
    assert "".join(chunk.text for chunk in chunks) == whole.text
    chat = client(served_lm).chat.completions.create(
        model="gpt2", messages=[{"role": "user", "content": PROMPTS[2]}], max_tokens=6, stream=True,
        extra_body={**GREEDY, "stream_interval": 5},
    )  # fmt: skip
    sizes = [len(chunk.choices[0].model_extra.get("token_ids") or []) for chunk in chat if chunk.choices]
    assert sizes == [0, 1, 5]  # the role alone first, as OpenAI sends it


def test_the_render_routes_give_the_ids_a_request_would_run_and_how_it_would_sample(
    served_lm, served_tokenizer
):
    """vLLM's `/v1/completions/render` (one a prompt) and `/v1/chat/completions/render`: the ids the
    tokenizer and Jinja give here, the ones the completion then runs; vLLM's sampling names and defaults,
    `max_tokens` within the room the context leaves; refused as the routes refuse, a beam search too."""
    from tests.test_serve_api import render

    ids = served_tokenizer.encode(PROMPTS[0]).ids
    body = {"prompt": [PROMPTS[0], PROMPTS[1]], "max_tokens": 6, "temperature": 0.5, "seed": 3, "stop": ["x"]}
    status, rendered = post(served_lm, "/v1/completions/render", body)
    second = served_tokenizer.encode(PROMPTS[1]).ids
    assert status == 200 and [each["token_ids"] for each in rendered] == [ids, second], rendered
    params = rendered[0]["sampling_params"]
    assert (params["temperature"], params["top_p"], params["top_k"], params["seed"]) == (0.5, 1.0, 0, 3)
    assert (params["max_tokens"], params["stop"], params["n"]) == (6, ["x"], 1)
    ran = post(
        served_lm, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 1, "return_token_ids": True}
    )
    assert ran[1]["choices"][0]["prompt_token_ids"] == ids
    unbounded = post(served_lm, "/v1/completions/render", {"prompt": ids})[1][0]["sampling_params"]
    assert unbounded["max_tokens"] == LM.n_positions - len(ids)
    messages = [{"role": "user", "content": PROMPTS[1]}]
    status, chat = post(
        served_lm, "/v1/chat/completions/render", {"messages": messages, "truncate_prompt_tokens": 5}
    )
    assert status == 200 and chat["token_ids"] == served_tokenizer.encode(render(messages)).ids[-5:], chat
    assert chat["request_id"].startswith("chatcmpl-") and chat["features"] is None
    long = served_tokenizer.encode(" ".join(PROMPTS) * 12).ids
    for path, refused, param in (
        ("/v1/completions/render", {"prompt": long}, "prompt"),
        ("/v1/completions/render", {"prompt": "a", "use_beam_search": True, "n": 2}, "use_beam_search"),
        ("/v1/chat/completions/render", {"messages": messages, "temperature": 3}, "temperature"),
    ):
        status, answer = post(served_lm, path, refused)
        assert status == 400 and answer["error"]["param"] == param, answer
