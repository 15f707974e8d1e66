"""The head explorer's page: one HTML file, its script and styles inlined, nothing fetched from elsewhere.

    page(api="")                           # served: the page asks `api`/api/... for explorations
    page(data=exploration.summary(True))   # standalone (`max-gpt2 heads --html`): the data inside

The page is `static/explorer.html` with `static/explorer.css` and `static/explorer.js` put in
place, and its settings as JSON in a `<script type="application/json" id="explorer-settings">`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATIC = Path(__file__).parent / "static"


def _embedded(value: Any) -> str:
    """JSON that cannot end the script element it sits in."""
    return json.dumps(value).replace("</", "<\\/")


def page(api: str = "", data: dict[str, Any] | None = None, text_input: bool = True) -> str:
    """The page: served (it asks `api` for data; `text_input`: the model has a tokenizer, else it takes
    token ids), or with `data` (an exploration's summary with its maps) and no server."""
    settings = {"api": api, "data": data, "textInput": text_input}
    html = (STATIC / "explorer.html").read_text(encoding="utf-8")
    return (
        html.replace("/*STYLE*/", (STATIC / "explorer.css").read_text(encoding="utf-8"))
        .replace("/*SCRIPT*/", (STATIC / "explorer.js").read_text(encoding="utf-8"))
        .replace("/*SETTINGS*/", _embedded(settings))
    )
