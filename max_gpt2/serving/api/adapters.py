"""llama-server's `/lora-adapters`: the LoRA adapters merged into the served weights (`max-gpt2 serve
--lora`, `--lora-scaled`; `max_gpt2.model.checkpoints.lora`).

`GET` lists them in llama-server's shape (`id`, `path`, `scale`, `task_name`, `prompt_prefix`), none
where none is merged. `POST` sets their scales in llama-server (an adapter left out at 0); merged
weights have theirs fixed, so a body that asks for the scales they have answers `{"success": true}`
and any other is a 400 naming `lora` that says how to start the server with others.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.protocol import Refusal, refusal_response
from max_gpt2.serving.api.served import Served


def merged(served: Served) -> list[dict[str, Any]]:
    """The merged adapters, as llama-server lists its own."""
    return [
        {"id": index, "path": path, "scale": scale, "task_name": "", "prompt_prefix": ""}
        for index, (path, scale) in enumerate(served.settings.lora)
    ]


async def list_adapters(request: Request) -> Response:
    return JSONResponse(merged(Served.of(request)))


async def set_adapters(request: Request) -> Response:
    served = Served.of(request)
    try:
        asked = scales(await request.body(), len(served.settings.lora))
    except Refusal as refusal:
        return refusal_response(refusal)
    if asked != [scale for _, scale in served.settings.lora]:
        return refusal_response(
            Refusal(
                "lora",
                f"lora: the adapters are merged into the weights at scales "
                f"{[scale for _, scale in served.settings.lora]}, and these ask for {asked}; start the "
                "server with --lora-scaled PATH:SCALE for others",
            )
        )
    return JSONResponse({"success": True})


def scales(body: bytes, count: int) -> list[float]:
    """The scale a `POST /lora-adapters` body asks of each of `count` adapters (0 where it is left out),
    as llama-server reads it; a `Refusal` where the body is not a list of `{"id", "scale"}`."""
    try:
        entries = json.loads(body)
    except ValueError:
        entries = None
    if not isinstance(entries, list):
        raise Refusal("lora", 'lora: the body must be a list of {"id": N, "scale": S}')
    found = [0.0] * count
    for index, entry in enumerate(entries):
        ident = entry.get("id") if isinstance(entry, dict) else None
        scale = entry.get("scale", 0.0) if isinstance(entry, dict) else None
        if not (isinstance(ident, int) and 0 <= ident < count and isinstance(scale, (int, float))):
            raise Refusal(
                "lora", f'lora[{index}]: must be {{"id": 0 to {count - 1}, "scale": a number}}; got {entry!r}'
            )
        found[ident] = float(scale)
    return found
