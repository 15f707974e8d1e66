"""The routes the server answers, and `mount`, which puts them and the guard on MAX's HTTP app.

| route | module |
|---|---|
| `POST /v1/completions` | `completions` |
| `POST /v1/chat/completions` (and llama-server's `/chat/completions`) | `chat` |
| `POST /v1/chat/completions/input_tokens` (llama-server's), `POST /apply-template` | `chat` |
| `POST /completion`, `POST /completions` (llama-server's own) | `native` |
| `POST /v1/responses` (and `/responses`), `POST /v1/responses/input_tokens` | `responses` |
| `POST /v1/messages`, `POST /v1/messages/count_tokens` (Anthropic's) | `messages` |
| `POST /v1/embeddings` (and `/embedding`), in place of the above on a server of embeddings | `embeddings` |
| `POST /score`, `POST /rerank` (vLLM's, and their `/v1/`, `/v2/rerank`) there too | `scores` |
| `POST /tokenize`, `POST /detokenize` | `tokens` |
| `GET /v1/models`, `GET /v1/models/{name}` (and `/models`) | here: each served name, its context length |
| `GET /metrics` | `metrics` |
| `GET /health` (and `/v1/health`), `GET /version`, `GET /props` (llama-server's) | here |
| `GET /lora-adapters`, `POST /lora-adapters` (llama-server's) | `adapters` |
| `GET /slots`, `POST /slots/{id}` (llama-server's) | `slots` |

MAX builds the app (its middleware, its engine in `app.state`); `mount` puts the routes served
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

from max_gpt2.serving.api.adapters import list_adapters, set_adapters
from max_gpt2.serving.api.chat import apply_template, count_chat_tokens, create_chat_completion
from max_gpt2.serving.api.completions import create_completion
from max_gpt2.serving.api.embeddings import create_embedding
from max_gpt2.serving.api.guard import NOT_SERVED, Explorer, Guard
from max_gpt2.serving.api.messages import count_tokens, create_message
from max_gpt2.serving.api.metrics import metrics
from max_gpt2.serving.api.native import create_native_completion
from max_gpt2.serving.api.native_fields import defaults
from max_gpt2.serving.api.protocol import Refusal, not_supported, refusal_response
from max_gpt2.serving.api.render import render_chat, render_completion
from max_gpt2.serving.api.responses import count_input_tokens, create_response
from max_gpt2.serving.api.scores import create_rerank, create_score
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.slots import Slots, act_on_slot, list_slots
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
    return JSONResponse({"status": "ok"})  # llama-server's body; MAX serves once the model is loaded


async def props(request: Request) -> Response:
    """llama-server's server properties, those its clients read: the context's length, the defaults of
    `/completion`, the chat template, the model and the build."""
    served = Served.of(request)
    tokenizer = served.tokenizer.delegate
    return JSONResponse(
        {
            "default_generation_settings": {"n_ctx": served.context_length, "params": defaults()},
            "total_slots": served.total_slots,
            "model_alias": served.settings.served_names[0],
            "model_path": str(served.config.model.model_path),
            "chat_template": tokenizer.chat_template or "",
            "bos_token": tokenizer.bos_token or "",
            "eos_token": tokenizer.eos_token or "",
            "modalities": {"vision": False, "audio": False},
            "build_info": f"max-gpt2 {installed('max-gpt2')}, MAX {installed('max')}",
        }
    )


async def change_props(request: Request) -> Response:
    """llama-server's `POST /props`, as a llama-server started without `--props` answers it."""
    return not_supported(
        "the server's properties are not changed here: they are fixed when it starts (max-gpt2 serve's "
        "options; llama-server answers so where started without --props)"
    )


async def version(request: Request) -> Response:
    return JSONResponse({"version": installed("max"), "max_gpt2": installed("max-gpt2")})


# A server that generates answers these, one of embeddings (`--embeddings`) `EMBEDDING`, both `COMMON`.
GENERATING = [
    Route("/v1/completions", create_completion, methods=["POST"]),
    Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
    Route("/chat/completions", create_chat_completion, methods=["POST"]),
    Route("/completion", create_native_completion, methods=["POST"]),
    Route("/completions", create_native_completion, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/v1/completions/render", render_completion, methods=["POST"]),  # vLLM's: the ids, not run
    Route("/v1/chat/completions/render", render_chat, methods=["POST"]),
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/responses", create_response, methods=["POST"]),
    Route("/v1/chat/completions/input_tokens", count_chat_tokens, methods=["POST"]),
    Route("/chat/completions/input_tokens", count_chat_tokens, methods=["POST"]),
    Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/slots", list_slots, methods=["GET"]),  # llama-server's
    Route("/slots/{id_slot}", act_on_slot, methods=["POST"]),
]
EMBEDDING = [
    Route("/v1/embeddings", create_embedding, methods=["POST"]),
    Route("/embedding", create_embedding, methods=["POST"]),  # llama-server's, in its shape
    Route("/embeddings", create_embedding, methods=["POST"]),
    *(Route(path, create_score, methods=["POST"]) for path in ("/score", "/v1/score")),  # vLLM's
    *(Route(path, create_rerank, methods=["POST"]) for path in ("/rerank", "/v1/rerank", "/v2/rerank")),
]
COMMON = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/models", list_models, methods=["GET"]),
    Route("/v1/models/{name:path}", get_model, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/v1/health", health, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
    Route("/props", props, methods=["GET"]),
    Route("/props", change_props, methods=["POST"]),
    Route("/lora-adapters", list_adapters, methods=["GET"]),  # llama-server's: those merged at start
    Route("/lora-adapters", set_adapters, methods=["POST"]),
]
GENERATES = (
    "this server generates text; a server started with --embeddings (llama-server's option; vLLM's "
    "--runner pooling) serves embeddings, and scores and reranks texts by them"
)
EMBEDS = "this server was started with --embeddings and generates no text (as vLLM's pooling runner)"


def served_routes(settings: ServingSettings) -> tuple[list[Route], dict[str, str]]:
    """The routes a server answers, and why it answers no other of ours or the peers' (`NOT_SERVED`)."""
    if settings.embeds:
        return [*EMBEDDING, *COMMON], {**NOT_SERVED, **dict.fromkeys((r.path for r in GENERATING), EMBEDS)}
    return [*GENERATING, *COMMON], {**NOT_SERVED, **dict.fromkeys((r.path for r in EMBEDDING), GENERATES)}


def mount(app: Any, settings: ServingSettings, api_key: str | None, explorer: Explorer | None) -> None:
    """Our routes, CORS and the guard on MAX's app (a FastAPI app, not yet serving)."""
    app.state.serving, app.state.slots = settings, Slots()
    routes, not_served = served_routes(settings)
    app.router.routes[:0] = routes
    if settings.allowed_origins:
        app.user_middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.allowed_origins),
                allow_methods=["*"],
                allow_headers=["*"],
            )
        )
    app.user_middleware.append(
        Middleware(Guard, routes=routes, api_key=api_key, explorer=explorer, not_served=not_served)
    )
