"""`GET /metrics` on the API's own port: MAX's Prometheus metrics, from its metrics process.

MAX records its serving metrics in a process of their own (the HTTP process's and the model
worker's alike: requests by status, prompt and generated tokens, time to first token and per
output token, running and queued requests, KV cache blocks in use) and would serve them on a
second TCP port (8001 unless told otherwise), which a second server on the host cannot bind.
`max-gpt2 serve` has that process serve them on a Unix socket in the server's own directory
instead (`metrics_process`), and this route reads the socket: the metrics come from the API's
port, behind its key, and no second port is opened. The main series come twice more, under the
names vLLM's and llama-server's dashboards and alerts read (`PEER_NAMES`: `vllm:num_requests_running`,
`llamacpp:tokens_predicted_total`, ...; vLLM's with its `model_name` label, its latencies in
seconds). docs/serving.md lists the metrics.
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
# MAX's family: its names in vLLM's and llama-server's metrics (vLLM's latencies in seconds, MAX's in ms).
PEER_NAMES: dict[str, tuple[str, ...]] = {
    "maxserve_num_requests_running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
    "maxserve_num_requests_queued": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
    "maxserve_num_input_tokens": ("vllm:prompt_tokens", "llamacpp:prompt_tokens"),
    "maxserve_num_output_tokens": ("vllm:generation_tokens", "llamacpp:tokens_predicted"),
    "maxserve_input_tokens_per_request_tokens": ("vllm:request_prompt_tokens",),
    "maxserve_output_tokens_per_request_tokens": ("vllm:request_generation_tokens",),
    "maxserve_time_to_first_token_milliseconds": ("vllm:time_to_first_token_seconds",),
    "maxserve_itl_milliseconds": ("vllm:inter_token_latency_seconds",),
    "maxserve_time_per_output_token_milliseconds": ("vllm:request_time_per_output_token_seconds",),
    "maxserve_request_time_milliseconds": ("vllm:e2e_request_latency_seconds",),
}


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
    from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics, generate_latest

    disable_created_metrics()  # as MAX's own endpoint: no `_created` series

    peers = CollectorRegistry(auto_describe=False)
    peers.register(PeerNames(REGISTRY, ServingSettings.from_environment().served_names[0]))

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(generate_latest(REGISTRY) + generate_latest(peers))

    server = socketserver.ThreadingUnixStreamServer(path, Answer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-socket", daemon=True).start()


class PeerNames:
    """A Prometheus collector: `PEER_NAMES`' families of `registry` under vLLM's and llama-server's names,
    vLLM's labelled with the model's name (`model_name`, as vLLM labels them) and in seconds."""

    def __init__(self, registry: Any, model_name: str) -> None:
        self.registry, self.model_name = registry, model_name

    def collect(self) -> Any:
        from prometheus_client.metrics_core import Metric

        for family in self.registry.collect():
            for name in PEER_NAMES.get(family.name, ()):
                vllm, unit = name.startswith("vllm:"), 1e-3 if family.name.endswith("_milliseconds") else 1
                renamed = Metric(name, family.documentation, family.type)
                for sample in family.samples:
                    labels = {**sample.labels, "model_name": self.model_name} if vllm else dict(sample.labels)
                    value, suffix = sample.value, sample.name[len(family.name) :]
                    if suffix == "_sum":  # a histogram's, in its unit; its buckets' bounds too
                        value *= unit
                    if "le" in labels and labels["le"] != "+Inf":
                        labels["le"] = repr(float(labels["le"]) * unit)
                    renamed.add_sample(name + suffix, labels, value)
                yield renamed
