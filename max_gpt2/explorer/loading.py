"""The explorer beside `max-gpt2 serve`'s API (`--explorer`): its own model, loaded in a thread.

MAX's model worker holds the served model in another process, and it has no attention-weights
graph; the explorer loads the same checkpoint, in the same device, dtype and weight format, in the
HTTP server's process, in a thread started by the first request for the explorer (so a server whose
explorer nobody opens spends nothing on it). The page is served at once; until the model is loaded
its JSON routes answer 503 and say so, and if the load fails, 500 with its error. The API serves on.

    settings = ExplorerSettings("~/models/gpt2", "cpu", "float32", None)
    ServingSettings(explorer=settings.to_json())        # how `max-gpt2 serve` hands it to MAX's
    explorer = LoadingExplorer(ExplorerSettings.from_json(...), prefix="/explore")
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass

from max_gpt2.explorer.app import ExplorerApp, Response, error_response
from max_gpt2.explorer.page import page


@dataclass(frozen=True)
class ExplorerSettings:
    """The checkpoint and how to load it (`load_lm`'s arguments; `weight_format` None: its own)."""

    checkpoint: str
    device: str
    dtype: str
    weight_format: str | None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ExplorerSettings:
        return cls(**json.loads(text))


class LoadingExplorer:
    """An `ExplorerApp` whose model loads in a daemon thread, started by the first request."""

    def __init__(self, settings: ExplorerSettings, prefix: str) -> None:
        self.settings, self.prefix = settings, prefix
        self._app: ExplorerApp | None = None
        self._failure: str | None = None
        self._loading = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Starts loading the model, once."""
        with self._loading:
            if not self._started:
                self._started = True
                threading.Thread(target=self._load, name="explorer-load", daemon=True).start()

    def _load(self) -> None:
        try:
            settings = self.settings
            self._app = ExplorerApp.load(
                settings.checkpoint,
                settings.device,
                settings.dtype,
                settings.weight_format,
                prefix=self.prefix,
            )
        except Exception as error:  # said on every request: the API serves on
            self._failure = f"the explorer's model did not load: {type(error).__name__}: {error}"

    def handle(self, method: str, path: str, query: str, body: bytes) -> Response:
        """`ExplorerApp.handle` once the model is loaded; until then the page, and 503 for the rest;
        500 if the load failed."""
        self.start()
        if self._app is not None:
            return self._app.handle(method, path, query, body)
        if method == "GET" and path.removeprefix(self.prefix) in ("", "/"):
            return 200, "text/html; charset=utf-8", page(api=self.prefix).encode()  # a server has text
        if self._failure is not None:
            return error_response(500, self._failure)
        return error_response(503, "the explorer's model is still loading (a minute or two the first time)")
