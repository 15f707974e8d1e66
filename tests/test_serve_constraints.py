"""Constrained output through the real server (`served_lm`, random weights): OpenAI's `response_format`,
vLLM's `structured_outputs` and llama-server's `json_schema` and `grammar`, on completions and chat,
streamed or not. Every output is checked apart from the engine (`jsonschema`, Python's `re`, the
list of choices); greedy output equals `lm.generate` with the same `Constraint`; what the engine
cannot compile, or two constraints at once, is a 400 naming the field."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from max_gpt2 import Constraint
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.testing import END_OF_TEXT
from tests.support import LM, requires_serving
from tests.test_constraints import DIGIT
from tests.test_serve import client, served
from tests.test_serve_api import post

pytestmark = requires_serving()
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["kind", "n"],
}
GRAMMAR = 'root ::= "(" [0-9] ("+" [0-9])? ")"'
CHOICES = ["yes", "no", 'a "quoted" one']
PROMPT = "The cat"


@pytest.fixture(scope="module")
def served_model(compiled_lm, served_lm):
    """The served weights in a compiled LM here, and the served tokenizer."""
    weights = Checkpoint(served_lm.checkpoint).model_weights()
    return compiled_lm(LM).with_weights(weights), load_tokenizer(served_lm.checkpoint)


def valid_json(text: str, schema: dict[str, Any] = SCHEMA) -> bool:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks the outputs")
    jsonschema.validate(json.loads(text), schema)
    return True


def is_object(text: str) -> bool:
    return isinstance(json.loads(text), dict)


# Any JSON object has no bound on its length (a string may run on): where it ends, it parses.
UNBOUNDED = {"openai json_object", "vllm older structural_tag"}  # the older: free text around its tags


def letters(text: str) -> bool:
    return re.fullmatch("[a-c]{2,4}", text) is not None


def sums(text: str) -> bool:
    return re.fullmatch(r"\([0-9](\+[0-9])?\)", text) is not None


def chosen(text: str) -> bool:
    return text in CHOICES


def tags_valid(text: str) -> bool:
    """Each `<f>...</f>` of `text` holds JSON valid against DIGIT, and the text between them no trigger."""
    free = re.sub(r"<f>(.*?)</f>", lambda tag: "" if valid_json(tag[1], DIGIT) else "<f>", text, flags=re.S)
    return "<f" not in free


def tagged(text: str) -> bool:
    return text.startswith("<f>") and text.endswith("</f>") and tags_valid(text)


FORM = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
CONTENT = {"type": "json_schema", "json_schema": DIGIT, "any_whitespace": False}
TAG = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "content": CONTENT, "end": "</f>"}}
OLDER_TAG = {"structures": [{"begin": "<f>", "schema": DIGIT, "end": "</f>"}], "triggers": ["<f"]}
# Each way a client asks (the fields of a completion's body) and what its text must pass.
ASKED: list[tuple[str, dict[str, Any], Any]] = [
    ("openai json_schema", {"response_format": FORM}, valid_json),
    ("openai json_object", {"response_format": {"type": "json_object"}}, is_object),
    ("vllm json", {"structured_outputs": {"json": SCHEMA}}, valid_json),
    ("vllm regex", {"structured_outputs": {"regex": "[a-c]{2,4}"}}, letters),
    ("vllm choice", {"structured_outputs": {"choice": CHOICES}}, chosen),
    ("vllm grammar", {"structured_outputs": {"grammar": GRAMMAR}}, sums),
    ("vllm guided_json", {"guided_json": SCHEMA, "guided_decoding_backend": "outlines"}, valid_json),
    ("vllm guided_regex", {"guided_regex": "[a-c]{2,4}"}, letters),
    ("vllm guided_choice", {"guided_choice": CHOICES}, chosen),
    ("vllm guided_grammar", {"guided_grammar": GRAMMAR}, sums),
    ("llama-server json_schema", {"json_schema": SCHEMA}, valid_json),
    ("llama-server grammar", {"grammar": GRAMMAR}, sums),
    ("structural_tag", {"response_format": TAG}, tagged),
    ("vllm structural_tag", {"structured_outputs": {"structural_tag": json.dumps(TAG)}}, tagged),
    ("vllm older structural_tag", {"response_format": {"type": "structural_tag", **OLDER_TAG}}, tags_valid),
]


@pytest.mark.parametrize(("name", "fields", "passes"), ASKED, ids=[case[0] for case in ASKED])
def test_every_spelling_gives_text_that_passes_its_check_sampled_and_streamed(
    served_lm, name, fields, passes
):
    server = served_lm
    for stream in (False, True):
        body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, "seed": 4, "n": 3, "stream": stream}
        answer = client(server).completions.create(model="gpt2", **body, extra_body=fields)
        texts, finishes = ["", "", ""], [None, None, None]
        for chunk in answer if stream else [answer]:
            for choice in chunk.choices:
                texts[choice.index] += choice.text
                finishes[choice.index] = choice.finish_reason or finishes[choice.index]
        ended = [text for text, finish in zip(texts, finishes, strict=True) if finish == "stop"]
        assert len(ended) == 3 or (name in UNBOUNDED and set(finishes) <= {"stop", "length"}), texts
        assert all(passes(text) for text in ended), texts


def test_greedy_constrained_completions_and_chats_are_what_lm_generate_gives(served_lm, served_model):
    server, (lm, tokenizer) = served_lm, served_model
    eos = tokenizer.token_to_id(END_OF_TEXT)
    prompt_ids = tokenizer.encode(PROMPT).ids
    schema = Constraint.json_schema(SCHEMA)
    ids = lm.generate(np.array([prompt_ids]), 40, constraint=schema, eos_token_id=eos, tokenizer=tokenizer)
    expected = ids[0, len(prompt_ids) :].tolist()
    expected = expected[: expected.index(eos) + 1]
    form = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    answer = client(server).completions.create(
        model="gpt2", prompt=PROMPT, max_tokens=40, temperature=0,
        extra_body={"response_format": form, "return_token_ids": True},
    )  # fmt: skip
    got = served(answer.choices[0])
    assert got.ids == expected and valid_json(got.text)
    short = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}
    chat = client(server).chat.completions.create(
        model="gpt2", messages=[{"role": "user", "content": "a cat?"}], max_tokens=24, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": short}},
    )  # fmt: skip
    assert chat.choices[0].finish_reason == "stop" and valid_json(chat.choices[0].message.content, short)


def test_drafts_under_a_constraint_keep_what_lm_generate_gives(served_lm, served_model):
    """The server drafts by prompt lookup (`--prompt-lookup 8`) for constrained requests too: each draft
    cut where the constraint forbids it and each position masked. A prompt that repeats itself, held
    to a pattern, alone and beside a free request and another pattern, gets `lm.generate`'s tokens,
    and the log says drafted tokens were kept."""
    server, (lm, tokenizer) = served_lm, served_model
    eos = tokenizer.token_to_id(END_OF_TEXT)
    prompts = ["the cat the cat the cat the cat", "the cat the cat the cat the cat", PROMPT]
    patterns = ["[a-z ]{1,30}", None, "[a-z ]{1,20}"]
    expected = []
    for prompt, pattern in zip(prompts, patterns, strict=True):
        ids = tokenizer.encode(prompt).ids
        constraint = Constraint.regex(pattern) if pattern else None
        new = lm.generate(np.array([ids]), 32, constraint=constraint, eos_token_id=eos, tokenizer=tokenizer)
        new = new[0, len(ids) :].tolist()
        expected.append(new[: new.index(eos) + 1] if eos in new else new)

    def request(i: int) -> list[int]:
        fields = {"structured_outputs": {"regex": patterns[i]}} if patterns[i] else {}
        answer = client(server).completions.create(
            model="gpt2", prompt=prompts[i], max_tokens=32, temperature=0,
            extra_body={"return_token_ids": True, **fields},
        )  # fmt: skip
        return served(answer.choices[0]).ids

    logged = len(server.log.read_text(errors="replace"))
    assert request(0) == expected[0]
    lines = server.log.read_text(errors="replace")[logged:].splitlines()
    kept = [int(line.split(" kept ")[1].split()[0]) for line in lines if "prompt lookup: request" in line]
    assert any(kept), server.tail(40)  # the constrained request alone drafted, and kept some
    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(request, range(len(prompts)))) == expected


def test_a_constraint_that_cannot_finish_ends_at_the_length(served_lm):
    server = served_lm
    answer = client(server).completions.create(
        model="gpt2",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        extra_body={"grammar": 'root ::= [a-z]+ "!"'},
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and re.fullmatch("[a-z]+", choice.text)


BAD_SCHEMA = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": 3}}}
FIVES = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5}}}  # not held: refused
REFUSED = [
    ({"response_format": BAD_SCHEMA}, "response_format", "response_format: json_schema: "),
    ({"json_schema": FIVES}, "json_schema", "json_schema: #/properties/n/multipleOf: the grammar engine"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema: required"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "response_format.type"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs", "structured_outputs: regex: "),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "choice needs a list of non-empty"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", "not a"),
    ({"grammar": "root ::= "}, "grammar", "grammar: grammar: "),
    ({"guided_regex": "(a"}, "guided_regex", "guided_regex: regex: "),
    ({"guided_choice": []}, "guided_choice", "guided_choice: choice needs a list of non-empty"),
    ({"guided_json": SCHEMA, "guided_decoding_backend": "mine"}, "guided_decoding_backend", "one of vLLM's"),
    (
        {"guided_regex": "a", "guided_whitespace_pattern": " "},
        "guided_whitespace_pattern",
        "takes no pattern",
    ),
    ({"guided_json": SCHEMA, "structured_outputs": {"regex": "a"}}, "guided_json", "structured_outputs sets"),
    ({"json_schema": SCHEMA, "grammar": GRAMMAR}, "grammar", "one constraint a request; json_schema sets"),
    ({"json_schema": SCHEMA, "min_tokens": 2}, "min_tokens", "a constrained text ends once complete"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", 'has a "format", or "structures"'),
    (
        {"structured_outputs": {"structural_tag": {**TAG, "format": {**TAG["format"], "end": 7}}}},
        "structured_outputs",
        "structured_outputs: structural_tag: ",
    ),
    (
        {
            "response_format": {
                "type": "structural_tag",
                **OLDER_TAG,
                "structures": [{"begin": "<f>", "schema": FIVES, "end": "</f>"}],
            }
        },
        "response_format",
        "structural_tag: #/properties/n/multipleOf: the grammar engine",
    ),
]
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("fields", "param", "says"), REFUSED)
def test_what_cannot_be_compiled_or_honoured_is_a_400_naming_the_field(served_lm, fields, param, says):
    server = served_lm
    for route, body in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", CHAT)):
        status, answer = post(server, route, {**body, "max_tokens": 4, **fields})
        assert status == 400 and answer["error"]["param"] == param, answer
        assert says in answer["error"]["message"], answer


def test_a_burst_of_constrained_and_free_requests_leaves_every_answer_right(served_lm, served_model):
    """24 requests at once, constrained ones beside free ones: each constrained text passes its check,
    each free greedy one is `lm.generate`'s, and the server answers on."""
    server, (lm, tokenizer) = served_lm, served_model
    eos = tokenizer.token_to_id(END_OF_TEXT)
    prompt_ids = tokenizer.encode(PROMPT).ids
    free = lm.generate(np.array([prompt_ids]), 8, eos_token_id=eos)[0, len(prompt_ids) :].tolist()
    free = free[: free.index(eos) + 1] if eos in free else free

    def request(i: int) -> bool:
        if i % 3 == 0:
            answer = client(server).completions.create(
                model="gpt2",
                prompt=PROMPT,
                max_tokens=8,
                temperature=0,
                extra_body={"return_token_ids": True},
            )
            return served(answer.choices[0]).ids == free
        _, fields, passes = bounded[i % len(bounded)]
        status, answer = post(
            server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "seed": i, **fields}
        )
        return status == 200 and bool(passes(answer["choices"][0]["text"]))

    bounded = [case for case in ASKED if case[0] not in UNBOUNDED]
    with ThreadPoolExecutor(24) as pool:
        assert all(pool.map(request, range(24)))
