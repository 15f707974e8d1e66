"""The HTTP guard in front of the routes: an API key, the routes served, the head explorer.

An ASGI middleware placed inside MAX's own (after its request-size limit), so it
sees each request before a route does:

- With an API key set, every request but `GET /health` (and llama-server's `/v1/health`) needs
  `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY` (as llama-server takes it), else 401,
  as llama-server and vLLM do with `--api-key`. A browser's
  CORS preflight never reaches it: with `--allowed-origins`, Starlette's CORS
  middleware, outside this one, answers it (`max_gpt2.serving.api.routes.mount`).
- Only our routes are answered (`routes.served_routes`: a server generates or embeds); speech and
  the rest, which MAX mounts for every model and which fail inside for this one, get OpenAI's
  404 naming what is served (and for the peers' routes GPT-2 cannot answer, `NOT_SERVED`, and
  the other kind of server's, why), and a route asked with another method a 405.
- With the head explorer (`max-gpt2 serve --explorer`), `/explore/` and what lies
  under it are its page and JSON routes, answered from a worker thread by its own
  model (`max_gpt2.explorer.loading`, which `max_gpt2.cli.serve_process` hands in).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

import anyio.to_thread
from starlette.responses import Response
from starlette.routing import BaseRoute, Match

from max_gpt2.serving.api.messages import error_response
from max_gpt2.serving.api.protocol import Refusal, refusal_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

EXPLORER = "/explore"  # the head explorer's page, and its routes under it
RERANKS = (
    "llama-server reranks with a reranking model's head, which GPT-2 has not; a server started with "
    "--embeddings answers /rerank by its vectors' cosines, as vLLM reranks with an embedding model"
)
# Routes of llama-server and vLLM that no server of ours answers, and why.
NOT_SERVED = {
    "/infill": "GPT-2 has no fill-in-the-middle tokens (llama-server refuses such models too)",
    "/pooling": "vLLM's pooling route is not served; a server started with --embeddings answers POST "
    "/v1/embeddings, OpenAI's, and llama-server's /embedding",
    **dict.fromkeys(("/reranking", "/v1/reranking"), RERANKS),
    **dict.fromkeys(
        ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
        "LoRA adapters are merged into the weights at start (max-gpt2 serve --lora PATH); GET "
        "/lora-adapters lists them",
    ),
    "/v1/audio/transcriptions": "GPT-2 reads text only",
}


class Explorer(Protocol):
    """What the guard asks of the head explorer: an answer (status, media type, body) to a request."""

    def handle(self, method: str, path: str, query: str, body: bytes) -> tuple[int, str, bytes]: ...


class Guard:
    """ASGI middleware: the API key, the routes served, the explorer (module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[BaseRoute],
        api_key: str | None = None,
        explorer: Explorer | None = None,
        not_served: Mapping[str, str] = NOT_SERVED,
    ) -> None:
        """`not_served`: why the peers' routes (and ours for the other kind of server) are not answered."""
        self.app, self.routes, self.api_key, self.explorer = app, routes, api_key, explorer
        self.not_served = not_served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self.check_key(scope)
            if self.explorer is not None and scope["path"].split("/")[1] == EXPLORER[1:]:
                return await self.explore(scope, receive, send)
            self.check_route(scope)
        except Refusal as refusal:
            anthropic = scope["path"].startswith("/v1/messages")  # its clients read Anthropic's errors
            answer = error_response(refusal) if anthropic else refusal_response(refusal)
            return await answer(scope, receive, send)
        return await self.app(scope, receive, send)

    async def explore(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The explorer's answer, from a worker thread: the model runs for seconds."""
        assert self.explorer is not None
        body = await read_body(receive)
        if body is None:  # the client left
            return None
        query = scope.get("query_string", b"").decode("latin-1")
        handle = self.explorer.handle
        status, kind, answer = await anyio.to_thread.run_sync(
            handle, scope["method"], scope["path"], query, body
        )
        headers = {"Cache-Control": "no-store"}
        return await Response(answer, status_code=status, media_type=kind, headers=headers)(
            scope, receive, send
        )

    def check_key(self, scope: Scope) -> None:
        """A `Refusal` (401) where a key is set and the request does not bear it (health is open)."""
        if self.api_key is None or scope["path"] in ("/health", "/v1/health"):
            return
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            given = headers.get(b"x-api-key", b"").decode("latin-1")  # Anthropic's clients send it
        if not hmac.compare_digest(given.strip(), self.api_key):
            needed = "a valid API key is needed: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')"
            raise Refusal(None, needed, status=401, headers={"WWW-Authenticate": "Bearer"})

    def check_route(self, scope: Scope) -> None:
        """A `Refusal` (404, or 405 for another method) for a request no route of ours answers."""
        matches = [route.matches(scope)[0] for route in self.routes]
        if Match.FULL in matches:
            return
        path, method = scope["path"], scope["method"]
        if Match.PARTIAL in matches:
            allowed = [
                verb
                for route, match in zip(self.routes, matches, strict=True)
                if match is Match.PARTIAL
                for verb in sorted(getattr(route, "methods", ()) or ())
                if verb != "HEAD"
            ]
            answers = ", ".join(allowed)
            raise Refusal(
                None, f"{path} answers {answers}, not {method}", status=405, headers={"Allow": answers}
            )
        served = ", ".join(getattr(route, "path", "?") for route in self.routes)
        why = f": {self.not_served[path.rstrip('/')]}" if path.rstrip("/") in self.not_served else ""
        raise Refusal(None, f"{path}: not served here{why}; this server answers {served}", status=404)


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
