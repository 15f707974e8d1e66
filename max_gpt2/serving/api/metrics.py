"""`GET /metrics` on the API's own port: MAX's Prometheus metrics, from its metrics process.

MAX records its serving metrics in a process of their own (the HTTP process's and the model
worker's alike: requests by status, prompt and generated tokens, time to first token and per
output token, running and queued requests, KV cache blocks in use) and would serve them on a
second TCP port (8001 unless told otherwise), which a second server on the host cannot bind.
`max-gpt2 serve` has that process serve them on a Unix socket in the server's own directory
instead (`metrics_process`), and this route reads the socket: the metrics come from the API's
port, behind its key, and no second port is opened. docs/serving.md lists the metrics.
"""

from __future__ import annotations

import asyncio
import socketserver
import threading
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from max_gpt2 import max_internals
from max_gpt2.serving.api.protocol import Refusal, refusal_response
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.settings import ServingSettings

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


def metrics_process(settings: Any, metrics_queue: Any, alive: Any, commit: Any) -> None:
    """MAX's metrics process (`max_internals.use_metrics_socket`), set up as MAX's own sets it up, its
    registry served on `ServingSettings.metrics_socket` instead of a port (`serve_registry`)."""
    from max.serve.telemetry.common import configure_metrics, configure_tracing

    configure_metrics(settings)
    configure_tracing(settings)
    if path := ServingSettings.from_environment().metrics_socket:
        serve_registry(path)
    max_internals.process_telemetry(metrics_queue, alive, commit)


def serve_registry(path: str) -> None:
    """Answers every connection to the Unix socket `path` with the Prometheus text of this process's
    registry, from a daemon thread."""
    from prometheus_client import REGISTRY, disable_created_metrics, generate_latest

    disable_created_metrics()  # as MAX's own endpoint: no `_created` series

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(generate_latest(REGISTRY))

    server = socketserver.ThreadingUnixStreamServer(path, Answer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-socket", daemon=True).start()
