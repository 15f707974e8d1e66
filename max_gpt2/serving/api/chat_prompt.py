"""A chat's messages, checked, and rendered by the chat template into its prompt.

The template is the checkpoint's own (`chat_template` in its `tokenizer_config.json`, or a
GGUF file's `tokenizer.chat_template`), or the one `max-gpt2 serve --chat-template` gives
(a Jinja file, or a built-in name: `max_gpt2.serving.chat_templates`); a server with neither
answers 400 naming the flag, as vLLM does. Hugging Face's tokenizer renders it (Jinja in a
sandbox, with its helpers), and the rendered text's ids are the prompt. Messages are checked
first: a role of `system`, `developer`, `user` or `assistant` (or `tool`, a tool's result),
content as a string or text parts, an assistant's `tool_calls` as OpenAI writes them, each
refusal naming the message and field; tool calls go to the template with their arguments
parsed, as vLLM passes them.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from jinja2 import TemplateError

from max_gpt2.serving.api.protocol import ChatRequest, PromptCacheOptions, Refusal, unset

if TYPE_CHECKING:  # the served model, whose module imports the checks that import this one
    from max_gpt2.serving.api.served import Served

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id"}


class Conversation(Protocol):
    """A request that gives a chat: a chat completion's, or `/tokenize`'s or `/v1/embeddings`' with
    `messages` (which have no tools)."""

    messages: Any
    add_generation_prompt: bool
    continue_final_message: bool
    chat_template_kwargs: dict[str, Any] | None


def rendered(served: Served, body: Conversation) -> str:
    """A request's messages, checked and rendered by the chat template with its flags and variables (and
    a chat completion's tools and documents), as text."""
    messages = checked_messages(body.messages)
    flags = body.add_generation_prompt, body.continue_final_message
    tools, documents = getattr(body, "tools", None), getattr(body, "documents", None)  # a chat's alone
    return render(served, messages, *flags, body.chat_template_kwargs, tools, documents)


def prompt_ids(served: Served, body: Conversation, special: bool = False) -> list[int]:
    """A request's chat, `rendered`, as token ids; `special`: the tokenizer's special tokens added too (the
    template writes its own)."""
    return served.tokenizer.delegate.encode(rendered(served, body), add_special_tokens=special)


def checked_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """`messages` as the template reads them (role, content as one string, name, an assistant's tool calls
    and a tool result's call id where given); a `Refusal` naming the first message and field that is
    not one."""
    if not messages:
        raise Refusal("messages", "messages: empty; give at least one message")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise Refusal("messages", f"{where}: must be an object with a role and content; got {message!r}")
        for field in message.keys() - MESSAGE_FIELDS:
            if unset(message[field]):
                continue  # OpenAI's message objects carry `refusal: null`, `tool_calls: []` and the like
            raise Refusal("messages", f"{where}.{field}: not a field of a message")
        role = message.get("role")
        if role not in ROLES:
            known = ", ".join(ROLES)
            if role is None:
                raise Refusal("messages", f"{where}.role: required, one of {known}")
            why = "the legacy function role: give tool" if role == "function" else f"must be one of {known}"
            raise Refusal("messages", f"{where}.role: {why}; got {role!r}")
        calls = tool_calls(message, where) if not unset(message.get("tool_calls")) else None
        given = message.get("content")
        checked.append({"role": role, "content": "" if given is None and calls else content(given, where)})
        if calls:
            checked[-1]["tool_calls"] = calls
        if role == "tool":
            if not isinstance(call_id := message.get("tool_call_id"), str):
                raise Refusal("messages", f"{where}.tool_call_id: required, the id of the call it answers")
            checked[-1]["tool_call_id"] = call_id
        if (name := message.get("name")) is not None:
            if not isinstance(name, str):
                raise Refusal("messages", f"{where}.name: must be a string; got {name!r}")
            checked[-1]["name"] = name
    return checked


def tool_calls(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as the template reads them: the arguments parsed, as vLLM
    passes them; a `Refusal` naming the first call that is not OpenAI's."""
    if message.get("role") != "assistant":
        raise Refusal("messages", f"{where}.tool_calls: only an assistant's message makes tool calls")
    given = message["tool_calls"]
    calls = []
    for index, made in enumerate(given if isinstance(given, list) else [None]):
        try:
            calls.append(parsed_call(made))
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError):
            raise Refusal(
                "messages",
                f'{where}.tool_calls[{index}]: must be {{"id", "type": "function", "function": {{"name", '
                '"arguments": JSON text}}',
            ) from None
    return calls


def parsed_call(made: Any) -> dict[str, Any]:
    """OpenAI's tool call `made`, its arguments parsed (given parsed, it is a call checked already)."""
    function = made["function"]
    arguments = function.get("arguments") or "{}"
    parsed = arguments if isinstance(arguments, dict) else json.loads(arguments)
    return {
        "id": made.get("id"),
        "type": "function",
        "function": {"name": function["name"], "arguments": parsed},
    }


def echoed(body: ChatRequest) -> str | None:
    """vLLM's chat `echo`: the last message's content where its role is the answer's (the assistant's, or
    with `add_generation_prompt` false the last message's own), else ""; None where not asked."""
    if not body.echo:
        return None
    if body.tools and body.tool_choice not in (None, "none"):
        raise Refusal("echo", "echo: a tool call's message has no content to put the last message's before")
    last = body.messages[-1] if body.messages and isinstance(body.messages[-1], dict) else {}
    if last.get("role") != ("assistant" if body.add_generation_prompt else last.get("role")):
        return ""
    return content(last.get("content") or "", f"messages[{len(body.messages) - 1}]")


def reads_kept_pages(options: PromptCacheOptions | None, messages: Sequence[Any]) -> bool:
    """Whether OpenAI's `prompt_cache_options` let a prompt of `messages` (a chat's, or a Responses
    request's items) read pages kept for earlier ones: all but `explicit` with no message part marked
    with a `prompt_cache_breakpoint` (OpenAI's caches none then)."""
    if options is None or options.mode == "implicit":
        return True
    parts = (
        part for message in messages if isinstance(message, dict) for part in message.get("content") or ()
    )
    return any(isinstance(part, dict) and part.get("prompt_cache_breakpoint") is not None for part in parts)


def content(value: Any, where: str) -> str:
    """A message's content as one string: a string, or OpenAI's text parts joined."""
    if isinstance(value, str):
        return value
    if value is None:
        raise Refusal("messages", f"{where}.content: required (a string, or a list of text parts)")
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Refusal(
                    "messages",
                    f"{where}.content[{index}]: GPT-2 reads text parts only "
                    f'({{"type": "text", "text": ...}}); got {kind!r}',
                )
            texts.append(part["text"])
        return "\n".join(texts)  # as vLLM and llama-server join a message's text parts
    raise Refusal("messages", f"{where}.content: must be a string or a list of text parts; got {value!r}")


def render(
    served: Served,
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
    continue_final_message: bool,
    options: dict[str, Any] | None,
    tools: list[Any] | None = None,
    documents: list[dict[str, str]] | None = None,
) -> str:
    """`messages` rendered by the served chat template: the prompt's text. `options` are the template's
    variables (`chat_template_kwargs`), where `add_generation_prompt` and `continue_final_message` given
    override the request's own, as vLLM lets them; `tools` and `documents` (vLLM's) the request's, for a
    template that shows them."""
    tokenizer = served.tokenizer.delegate  # Hugging Face's, holding the template
    if tokenizer.chat_template is None:
        raise Refusal(
            None,
            "this model has no chat template (its tokenizer_config.json has no chat_template): start the "
            "server with --chat-template FILE, or a built-in one (--chat-template chatml), or use "
            "/v1/completions",
        )
    flags = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message}
    variables = dict(options or {})
    rendering = inspect.signature(tokenizer.apply_chat_template).parameters.keys() - {"kwargs"}
    for key in variables.keys() & rendering:
        value = variables.pop(key)
        if key not in flags:
            raise Refusal(
                "chat_template_kwargs", f"chat_template_kwargs.{key}: the rendering's own, not a template's"
            )
        if not isinstance(value, bool):
            raise Refusal("chat_template_kwargs", f"chat_template_kwargs.{key}: must be true or false")
        flags[key] = value
    if flags["add_generation_prompt"] and flags["continue_final_message"]:
        raise Refusal(
            "continue_final_message",
            "continue_final_message: cannot be true with add_generation_prompt (the default): set "
            "add_generation_prompt to false to continue the last message",
        )
    if flags["continue_final_message"] and messages[-1]["role"] != "assistant":
        raise Refusal(
            "continue_final_message", "continue_final_message: the last message is not the assistant's"
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, documents=documents, tokenize=False, **flags, **variables
        )
    except (TemplateError, TypeError, ValueError) as error:  # the template's raise_exception
        raise Refusal("messages", f"messages: the chat template could not render them: {error}") from None
