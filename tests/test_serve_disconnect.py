"""A client that hangs up before its answer, through MAX's own request middleware: no server, no model.

The route's wait (`unless_client_leaves`) must end in what MAX's middleware answers 499 for, the
work it waited on cancelled; anything else reached the middleware as no response at all, which it
logged as an ERROR traceback and counted as a 500.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from max.serve.request import register_request

from max_gpt2.serving.api.waiting import unless_client_leaves


def app_and_work(seconds: float) -> tuple[FastAPI, list[asyncio.Task[Any]]]:
    """An app with MAX's request middleware and one route that waits on two choices of `seconds`."""
    app, started = FastAPI(), []
    register_request(app)

    @app.post("/wait")
    async def wait(request: Request) -> JSONResponse:
        await request.body()
        started.extend(asyncio.ensure_future(asyncio.sleep(seconds, i)) for i in range(2))
        return JSONResponse({"answers": await unless_client_leaves(request, asyncio.gather(*started))})

    return app, started


async def call(app: FastAPI, leave_after: float | None) -> list[dict[str, Any]]:
    """What the app sends for one POST /wait; the client hangs up `leave_after` s after its body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/wait", "raw_path": b"/wait", "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600 if leave_after is None else leave_after)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=30)
    return sent


def test_a_client_that_leaves_gets_499_and_its_choices_are_cancelled():
    app, started = app_and_work(60)
    sent = asyncio.run(call(app, leave_after=0.2))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert len(started) == 2 and all(choice.cancelled() for choice in started)


def test_a_client_that_stays_gets_the_answer():
    app, _ = app_and_work(0.05)
    sent = asyncio.run(call(app, leave_after=None))
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"answers": [0, 1]}
