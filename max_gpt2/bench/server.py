"""`max-gpt2 serve` in a child process, for tests and benchmarks that talk to a real server.

`ServerProcess` starts the server in its own process group and stops the whole
group (MAX's model worker included) when asked; `free_port` finds a port for it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class ServerProcess:
    """`max-gpt2 serve` in a child process (its own process group), for tests and benchmarks.

    Creating one starts the server and returns at once; `wait_until_ready` polls
    `/health` until the model is compiled and loaded; `stop` ends the server and MAX's workers with it.
    The child's output goes to `log`.
    """

    def __init__(self, checkpoint: Path, log: Path, port: int, *options: str) -> None:
        self.checkpoint, self.port, self.log = checkpoint, port, log
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "max_gpt2", "serve", "--checkpoint", str(checkpoint)]
        with log.open("w") as output:
            self.process = subprocess.Popen(
                [*command, "--port", str(port), *options],
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MAX_SERVE_DISABLE_TELEMETRY": "1"},  # nothing to report to offline
                start_new_session=True,
            )

    def wait_until_ready(self, timeout: float) -> float:
        """Seconds until `/health` answered; a `RuntimeError` with the log's tail if it died or timed out."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            except OSError:  # not listening yet
                pass
            time.sleep(1)
        raise RuntimeError(f"the server was not ready after {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM to the whole group, then SIGKILL to whatever is left."""
        for sig, grace in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(grace)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
