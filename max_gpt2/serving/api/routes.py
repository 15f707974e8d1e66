"""The routes the server answers, and `mount`, which puts them and the guard on MAX's HTTP app.

| route | module |
|---|---|
| `POST /v1/completions` | `completions` |
| `POST /v1/chat/completions` | `chat` |
| `POST /tokenize`, `POST /detokenize` | `tokens` |
| `GET /v1/models`, `GET /v1/models/{name}` | here: every served name, with its context length |
| `GET /metrics` | `metrics` |
| `GET /health`, `GET /version` | here |

MAX builds the app (its middleware, its engine in `app.state`); `mount` puts these routes
before MAX's own, so MAX's routes of the same paths are never reached and its others are
refused by the guard, then adds CORS where origins are allowed, outside the guard so a
browser's preflight needs no key, and the guard.
"""

from __future__ import annotations

import time
from importlib.metadata import version as installed
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from max_gpt2.serving.api.chat import create_chat_completion
from max_gpt2.serving.api.completions import create_completion
from max_gpt2.serving.api.guard import Explorer, Guard
from max_gpt2.serving.api.metrics import metrics
from max_gpt2.serving.api.protocol import Refusal, refusal_response
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.tokens import detokenize, tokenize
from max_gpt2.serving.settings import ServingSettings


async def list_models(request: Request) -> Response:
    served = Served.of(request)
    return JSONResponse(
        {"object": "list", "data": [model(served, name) for name in served.settings.served_names]}
    )


async def get_model(request: Request) -> Response:
    served, name = Served.of(request), request.path_params["name"]
    try:
        if not name:  # `/v1/models/`: a request naming no model means the first, a model's path does not
            raise Refusal(None, "/v1/models/NAME: give a model's name (GET /v1/models lists them)", 404)
        return JSONResponse(model(served, served.model_name(name)))
    except Refusal as refusal:
        return refusal_response(refusal)


def model(served: Served, name: str) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's `max_model_len`."""
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "max-gpt2",
        "max_model_len": served.context_length,
    }


async def health(request: Request) -> Response:
    return Response(status_code=200)  # MAX serves once the model is loaded


async def version(request: Request) -> Response:
    return JSONResponse({"version": installed("max"), "max_gpt2": installed("max-gpt2")})


ROUTES = [
    Route("/v1/completions", create_completion, methods=["POST"]),
    Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{name:path}", get_model, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
]


def mount(app: Any, settings: ServingSettings, api_key: str | None, explorer: Explorer | None) -> None:
    """Our routes, CORS and the guard on MAX's app (a FastAPI app, not yet serving)."""
    app.state.serving = settings
    app.router.routes[:0] = ROUTES
    if settings.allowed_origins:
        app.user_middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.allowed_origins),
                allow_methods=["*"],
                allow_headers=["*"],
            )
        )
    app.user_middleware.append(Middleware(Guard, routes=ROUTES, api_key=api_key, explorer=explorer))
