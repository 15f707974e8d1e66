"""llama-server's `/lora-adapters`: the LoRA adapters merged into the served weights (`max-gpt2 serve
--lora`, `--lora-scaled`; `max_gpt2.model.checkpoints.lora`).

`GET` lists them in llama-server's shape (`id`, `path`, `scale`, `task_name`, `prompt_prefix`), none
where none is merged. `POST` sets their scales in llama-server (an adapter left out at 0); merged
weights have theirs fixed, so a body that asks for the scales they have answers `{"success": true}`
and any other is a 400 naming `lora` (`llama_fields.check_lora`, which checks a request's `lora` too).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.llama_fields import check_lora
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
        check_lora(json.loads(await request.body()), served.lora_scales)
    except ValueError:
        return refusal_response(Refusal("lora", 'lora: the body must be a list of {"id": N, "scale": S}'))
    except Refusal as refusal:
        return refusal_response(refusal)
    return JSONResponse({"success": True})
