"""What a request's text must be: the one constraint its fields set, and the field that set it.

OpenAI's `response_format` (vLLM's and MAX's `structural_tag` too), vLLM's `structured_outputs` (or
its older `guided_json`, `guided_regex`, `guided_choice` and `guided_grammar`, which vLLM's clients
still send), llama-server's `json_schema` and `grammar`, and a chat's tools called by name or as
required (`max_gpt2.serving.api.tools`) each make a `Constraint`; a request may set one. vLLM's
`guided_decoding_backend` names how vLLM would hold the text to it: any of vLLM's is taken, the text
held to the same constraint by xgrammar here. Whether the engine compiles it is the route's to check
(`Served.check_constraint`).
"""

from __future__ import annotations

from typing import Any

from max_gpt2.inference.constraints import Constraint
from max_gpt2.serving.api.protocol import Refusal, Sampling
from max_gpt2.serving.api.tools import ToolCalls

GUIDED_BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")  # vLLM's names


def constraint_of(
    body: Sampling, called: tuple[ToolCalls, Constraint] | None
) -> tuple[str, Constraint] | None:
    """What the text must be, from whichever of OpenAI's `response_format`, vLLM's `structured_outputs`
    and llama-server's `json_schema` and `grammar` the request sets, or its tools `called`, with that
    field; a `Refusal` where it sets two."""
    given: list[tuple[str, Constraint]] = [("tool_choice", called[1])] if called else []
    if (form := body.response_format) is not None and form.type != "text":
        if form.type == "json_object":
            given.append(("response_format", Constraint.json_object()))
        elif form.type == "structural_tag":
            given.append(("response_format", _tag(form.model_dump(exclude_none=True), "response_format")))
        elif form.json_schema is None or form.json_schema.json_schema is None:
            raise Refusal("response_format", "response_format.json_schema.schema: required for json_schema")
        else:
            given.append(("response_format", Constraint.json_schema(form.json_schema.json_schema)))
    if (outputs := body.structured_outputs) is not None:
        asked = [
            Constraint.json_schema(outputs.json_) if outputs.json_ is not None else None,
            Constraint.json_object() if outputs.json_object else None,
            Constraint.regex(outputs.regex) if outputs.regex is not None else None,
            _choice(outputs.choice) if outputs.choice is not None else None,
            Constraint.grammar(outputs.grammar) if outputs.grammar is not None else None,
            _tag(outputs.structural_tag, "structured_outputs")
            if outputs.structural_tag is not None
            else None,
        ]
        given += [("structured_outputs", each) for each in asked if each is not None]
    given += [(field, each) for field, each in _guided(body) if each is not None]
    if body.json_schema:  # llama-server's: empty, none
        given.append(("json_schema", Constraint.json_schema(body.json_schema)))
    if body.grammar:
        given.append(("grammar", Constraint.grammar(body.grammar)))
    if len(given) > 1:
        raise Refusal(given[1][0], f"{given[1][0]}: one constraint a request; {given[0][0]} sets one already")
    return given[0] if given else None


def _guided(body: Sampling) -> list[tuple[str, Constraint | None]]:
    """The constraints of vLLM's `guided_*` fields, by field (None: not given)."""
    if (backend := body.guided_decoding_backend) is not None and backend not in GUIDED_BACKENDS:
        raise Refusal(
            "guided_decoding_backend",
            f"guided_decoding_backend: one of vLLM's, {', '.join(GUIDED_BACKENDS)} (xgrammar holds the text "
            f"here whichever is named); got {backend!r}",
        )
    return [
        ("guided_json", None if body.guided_json is None else Constraint.json_schema(body.guided_json)),
        ("guided_regex", None if body.guided_regex is None else Constraint.regex(body.guided_regex)),
        (
            "guided_choice",
            None if body.guided_choice is None else _choice(body.guided_choice, "guided_choice"),
        ),
        ("guided_grammar", None if body.guided_grammar is None else Constraint.grammar(body.guided_grammar)),
    ]


def _tag(tag: dict[str, Any] | str, field: str) -> Constraint:
    """A structural tag's constraint; a `Refusal` naming `field` where it is in neither of its forms."""
    try:
        return Constraint.structural_tag(tag)
    except ValueError as error:
        raise Refusal(field, f"{field}: {error}") from None


def _choice(choices: list[str], field: str = "structured_outputs") -> Constraint:
    try:
        return Constraint.choice(choices)
    except ValueError as error:
        where = f"{field}." if field == "structured_outputs" else f"{field}: "
        raise Refusal(field, f"{where}{error}") from None
