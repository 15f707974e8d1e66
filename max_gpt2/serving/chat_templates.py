"""Chat templates `max-gpt2 serve --chat-template` takes: a Jinja file, or a built-in one by name.

    chat_template_file("chatml")            # max_gpt2/serving/templates/chatml.jinja
    chat_template_file("~/my-template.j2")  # that file, once its Jinja parses

A checkpoint's own template (`chat_template` in its `tokenizer_config.json`, or a GGUF file's
`tokenizer.chat_template`) needs no flag; the flag replaces it. The file goes to MAX's
`--chat-template`, which hands it to the tokenizer that renders chats
(`max_gpt2.serving.api.chat`). A template is checked here, before anything loads: a missing
file or one whose Jinja does not parse is refused, naming it (and the line).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"


def built_in() -> list[str]:
    """The names of the templates shipped with the package."""
    return sorted(path.stem for path in TEMPLATES.glob("*.jinja"))


def chat_template_file(value: str) -> Path:
    """The file `--chat-template value` names (a built-in name, or a path); a ValueError says why not."""
    import jinja2

    path = TEMPLATES / f"{value}.jinja" if value in built_in() else Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"--chat-template {value}: no such file, nor a built-in template ({', '.join(built_in())})"
        )
    try:
        jinja2.Environment().parse(path.read_text())
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"--chat-template {path}: line {error.lineno}: {error.message}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--chat-template {path}: not a UTF-8 text file") from None
    return path.resolve()
