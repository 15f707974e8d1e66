"""`max-gpt2 serve` in a child process, for tests and benchmarks that talk to a real server.

`ServerProcess` starts the server in its own process group and stops the whole
group (MAX's model worker included) when asked; `free_port` finds a port for it.
The server never outlives the process that started it: a watchdog process
(`python -m max_gpt2.bench.server --watch PID PGID`, in a session of its own)
ends the group once that process is gone, however it ended (SIGTERM, SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import max_gpt2
from max_gpt2.serving.settings import API_KEY_VARIABLE

SOURCE_ROOT = Path(max_gpt2.__file__).resolve().parents[1]
"""Where the `max_gpt2` this process runs lies: the server runs the same code, whatever the working
directory (a benchmark of another checkout, run with `PYTHONPATH`, serves that checkout)."""


class ServerProcess:
    """`max-gpt2 serve` in a child process (its own process group), for tests and benchmarks.

    Creating one starts the server and returns at once; `wait_until_ready` polls
    `/health` until the model is compiled and loaded; `stop` ends the server and MAX's workers with it.
    The child's output goes to `log`.
    """

    def __init__(
        self,
        checkpoint: Path,
        log: Path,
        port: int,
        *options: str,
        env: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        """`env`: variables set for the server on top of this process's environment; `api_key`: the
        key it requires (`max-gpt2 serve --api-key`, passed in the environment), or None for none."""
        self.checkpoint, self.port, self.log, self.api_key = checkpoint, port, log, api_key
        key = {API_KEY_VARIABLE: api_key} if api_key else {}
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "max_gpt2", "serve", "--checkpoint", str(checkpoint.resolve())]
        with log.open("w") as output:
            self.process = subprocess.Popen(
                [*command, "--port", str(port), *options],
                cwd=SOURCE_ROOT,  # `-m` imports from the working directory first
                stdout=output,
                stderr=subprocess.STDOUT,
                env={
                    **{name: value for name, value in os.environ.items() if name != API_KEY_VARIABLE},
                    **key,
                    **(env or {}),
                },
                start_new_session=True,
            )
        self.watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "max_gpt2.bench.server",
                "--watch",
                str(os.getpid()),
                str(self.process.pid),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=dict(os.environ),
            start_new_session=True,  # not in the server's group, nor killed with its parent's
        )

    def wait_until_ready(self, timeout: float) -> float:
        """Seconds until `/health` answered; a `RuntimeError` with the log's tail if it died or timed out."""
        try:
            return wait_for_health(self.url, self.process, timeout)
        except RuntimeError as error:
            raise RuntimeError(f"{error}:\n{self.tail()}") from None

    def stop(self) -> None:
        """SIGTERM to the whole group, then SIGKILL to whatever is left; the watchdog goes too."""
        stop_group(self.process.pid, self.process.poll)
        self.watchdog.kill()
        self.watchdog.wait()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def wait_for_health(url: str, process: subprocess.Popen, timeout: float) -> float:
    """Seconds until `url/health` answered 200 (any OpenAI-style server: ours, llama-server);
    a `RuntimeError` if `process` exited first or `timeout` seconds passed."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:  # not listening yet
            pass
        time.sleep(1)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s")


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_group(group: int, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM to process group `group`, then SIGKILL to whatever is left after a grace period.

    `reap` collects an exited child of ours, which until then counts as alive.
    """
    for sig, grace in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            reap()
            try:
                os.killpg(group, 0)  # anyone left?
            except ProcessLookupError:
                return
            time.sleep(0.2)


def watch(parent: int, group: int) -> None:
    """Waits for process `parent` to end, then stops process group `group` (the server and its workers)."""
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            break
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return  # the server is already gone
        time.sleep(1)
    stop_group(group)


if __name__ == "__main__":
    _, flag, parent_pid, group_id = sys.argv
    assert flag == "--watch", "usage: python -m max_gpt2.bench.server --watch PARENT_PID GROUP_ID"
    watch(int(parent_pid), int(group_id))
