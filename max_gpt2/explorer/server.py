"""The head explorer on its own: `ExplorerApp` behind Python's threading HTTP server (`max-gpt2 explore`).

server = explorer_server(app, "127.0.0.1", 8010)   # bound; serve_forever() answers requests
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from max_gpt2.explorer.app import ExplorerApp

MAX_BODY = 1 << 20  # bytes a request may send: a text, not a book


def explorer_server(app: ExplorerApp, host: str, port: int) -> ThreadingHTTPServer:
    """A server bound to `host`:`port` whose every request `app` answers."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.answer("GET")

        def do_POST(self) -> None:
            self.answer("POST")

        def answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.send_error(413, f"a request may send {MAX_BODY} bytes")
                return
            url = urlsplit(self.path)
            status, kind, body = app.handle(method, url.path, url.query, self.rfile.read(length))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet: the console is the user's
            pass

    return ThreadingHTTPServer((host, port), Handler)
