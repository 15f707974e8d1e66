"""What a request's text must be: the one constraint its fields set, and the field that set it.

OpenAI's `response_format`, vLLM's `structured_outputs`, llama-server's `json_schema` and
`grammar`, and a chat's tools called by name or as required (`max_gpt2.serving.api.tools`) each
make a `Constraint`; a request may set one. Whether the engine compiles it is the route's to
check (`Served.check_constraint`).
"""

from __future__ import annotations

from max_gpt2.inference.constraints import Constraint
from max_gpt2.serving.api.protocol import Refusal, Sampling
from max_gpt2.serving.api.tools import ToolCalls


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
        ]
        given += [("structured_outputs", each) for each in asked if each is not None]
    if body.json_schema:  # llama-server's: empty, none
        given.append(("json_schema", Constraint.json_schema(body.json_schema)))
    if body.grammar:
        given.append(("grammar", Constraint.grammar(body.grammar)))
    if len(given) > 1:
        raise Refusal(given[1][0], f"{given[1][0]}: one constraint a request; {given[0][0]} sets one already")
    return given[0] if given else None


def _choice(choices: list[str]) -> Constraint:
    try:
        return Constraint.choice(choices)
    except ValueError as error:
        raise Refusal("structured_outputs", f"structured_outputs.{error}") from None
