"""The HTTP guard in front of MAX's routes: an API key, the routes GPT-2 answers, checked completions.

An ASGI middleware placed inside MAX's own (after its request-size limit), so it
sees each request before a route does:

- With an API key set, every request but `GET /health` needs `Authorization:
  Bearer KEY`, else 401, as llama-server and vLLM do with `--api-key`.
- Only what GPT-2 can answer is routed: `POST /v1/completions`, `GET /v1/models`
  (and `/v1/models/{id}`), `/health`, `/version` and `/metrics`. Chat completions get
  OpenAI's 404 for a model that is not a chat model (GPT-2 has no chat template);
  embeddings, speech and the rest, which MAX mounts for every model and which fail
  inside for this one, get 404 too.
- With the head explorer (`max-gpt2 serve --explorer`), `/explore/` and what
  lies under it are its page and JSON routes (`max_gpt2.explorer.app`), answered
  from a worker thread by its own model (`max_gpt2.explorer.loading`).
- A completion's body goes through `max_gpt2.serving.requests.check_completion`:
  a refusal is answered here (OpenAI's error body, `param` naming the field), an
  accepted body goes on as rewritten there, and where `n` copied each prompt the
  response's `usage` counts each prompt once, as OpenAI's does.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio.to_thread
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, Response

from max_gpt2.explorer.loading import LoadingExplorer
from max_gpt2.serving.max_internals import error_body
from max_gpt2.serving.requests import Refusal, check_completion

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COMPLETIONS = "/v1/completions"
ROUTES = {"/health": "GET", "/version": "GET", "/v1/models": "GET", COMPLETIONS: "POST"}
ROUTE_PREFIXES = {"/v1/models/": "GET", "/metrics": "GET"}
CHAT = "/v1/chat/completions"
EXPLORER = "/explore"  # the head explorer's page, and its routes under it


def install(app: Any, api_key: str | None, explorer: LoadingExplorer | None = None) -> None:
    """Puts `Guard` inside the middleware MAX gave `app` (a FastAPI app, not yet serving)."""
    app.user_middleware.append(Middleware(Guard, api_key=api_key, explorer=explorer))


class Guard:
    """ASGI middleware: the API key, the routes served, and `/v1/completions` bodies (module docstring)."""

    def __init__(
        self, app: ASGIApp, api_key: str | None = None, explorer: LoadingExplorer | None = None
    ) -> None:
        self.app, self.api_key, self.explorer = app, api_key, explorer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self.check_key(scope)
            if self.explorer is not None and scope["path"].split("/")[1] == EXPLORER[1:]:
                return await self.explore(scope, receive, send)
            self.check_route(scope["method"], scope["path"])
        except Refusal as refusal:
            return await refuse(refusal, scope, receive, send)
        if scope["path"] != COMPLETIONS:
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        if body is None:  # the client left
            return None
        try:
            parsed = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = None  # MAX answers it: "Missing JSON."
        if not isinstance(parsed, dict):
            return await self.app(scope, replay(body, receive), send)
        try:
            check_model(parsed.get("model"), scope["app"].state.pipeline.model_name)
            checked = check_completion(parsed)
        except Refusal as refusal:
            return await refuse(refusal, scope, receive, send)
        rewritten = json.dumps(checked.body).encode()
        reply = send if checked.copies == 1 else usage_per_prompt(send, checked.copies)
        return await self.app(scope, replay(rewritten, receive), reply)

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
        """A `Refusal` (401) where a key is set and the request does not bear it (`/health` is open)."""
        if self.api_key is None or scope["path"] == "/health":
            return
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), self.api_key):
            raise Refusal(
                None, "a valid API key is needed: send the header 'Authorization: Bearer KEY'", status=401
            )

    @staticmethod
    def check_route(method: str, path: str) -> None:
        """A `Refusal` (404, or 405 for another method) for a route this server does not answer."""
        wanted = ROUTES.get(path) or next(
            (verb for prefix, verb in ROUTE_PREFIXES.items() if path.startswith(prefix)), None
        )
        if path == CHAT:
            raise Refusal(
                None,
                "This is not a chat model and thus not supported in the v1/chat/completions endpoint "
                "(GPT-2 has no chat template). Did you mean to use v1/completions?",
                status=404,
            )
        if wanted is None:
            served = ", ".join([*ROUTES, "/v1/models/{id}", "/metrics"])
            raise Refusal(None, f"{path}: not served here; this server answers {served}", status=404)
        if method != wanted:
            raise Refusal(None, f"{path} answers {wanted}, not {method}", status=405)


def check_model(asked: Any, served: str) -> None:
    """A `Refusal` (404, as OpenAI's) where a request names a model other than the one served."""
    if isinstance(asked, str) and asked and asked != served:
        raise Refusal("model", f"model: {asked!r} is not served here; this server serves {served!r}", 404)


async def refuse(refusal: Refusal, scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with OpenAI's error body for `refusal`, its `param` the field it names."""
    body = error_body(refusal.status, refusal.message, refusal.param)
    headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
    await JSONResponse(body, status_code=refusal.status, headers=headers)(scope, receive, send)


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


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` as the request's, then whatever the client sends next."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def next_message() -> Message:
        return pending.pop() if pending else await receive()

    return next_message


def usage_per_prompt(send: Send, copies: int) -> Send:
    """A `send` that, in a successful JSON response, counts each prompt's tokens once in `usage`
    (MAX counted each of the `copies` that `n` made)."""
    start: Message = {}
    chunks: list[bytes] = []

    async def send_fixed(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
            return
        if message["type"] != "http.response.body":
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return None
        body = b"".join(chunks)
        if start["status"] == 200:
            answer = json.loads(body)
            usage = answer.get("usage") or {}
            if "prompt_tokens" in usage:
                usage["prompt_tokens"] //= copies
                usage["total_tokens"] = usage["prompt_tokens"] + usage.get("completion_tokens", 0)
            body = json.dumps(answer).encode()
        headers = [(name, value) for name, value in start["headers"] if name.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return send_fixed
