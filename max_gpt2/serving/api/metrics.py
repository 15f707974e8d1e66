"""`GET /metrics` on the API's own port: MAX's Prometheus metrics, from its metrics process.

MAX records its serving metrics in a process of their own (the HTTP process's and the model
worker's alike: requests by status, prompt and generated tokens, time to first token and per
output token, running and queued requests, KV cache blocks in use) and would serve them on a
second TCP port (8001 unless told otherwise), which a second server on the host cannot bind.
`max-gpt2 serve` has that process serve them on a Unix socket in the server's own directory
instead (`max_internals.metrics_process`), and this route reads
the socket: the metrics come from the API's port, behind its key, and no second port is
opened. docs/serving.md lists the metrics.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from max_gpt2.serving.api.protocol import Refusal, refusal_response
from max_gpt2.serving.api.served import Served

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: Request) -> Response:
    path = Served.of(request).settings.metrics_socket
    if path is None:
        return refusal_response(
            Refusal(None, "metrics are not served: MAX's server was started without ours", 404)
        )
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        text = await reader.read()
        writer.close()
    except OSError as error:
        return refusal_response(
            Refusal(None, f"MAX's metrics process is not answering ({error.strerror}); try again", 503)
        )
    return Response(text, media_type=PROMETHEUS_TEXT)
