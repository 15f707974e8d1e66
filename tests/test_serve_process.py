"""`max-gpt2 serve` as a process: a port in use refused up front, a dead worker ends the server, and
nothing is left behind once it is gone.

MAX's server makes its ZMQ sockets in the temporary directory and leaves them
there when it stops; `max-gpt2 serve` hands it a directory of its own and has
a watching shell remove it once the server is gone, however it ended. Starts a server of its
own (on LM's shapes, as the session's: its graphs are in MAX's cache by then).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from max_gpt2.bench.server import ServerProcess, free_port
from tests.support import LM, requires_serving, run_python

pytestmark = requires_serving()


def processes_naming(text: str) -> list[str]:
    """The command lines of running processes that contain `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if text in command:
            found.append(command)
    return found


def spawned_children(parent: int) -> list[int]:
    """The processes `parent` started through multiprocessing's spawn (MAX's model worker among them)."""
    children = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            command = (status.parent / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        if int(fields.get("PPid", "0")) == parent and b"spawn_main" in command:
            children.append(int(status.parent.name))
    assert children, f"no spawned worker under process {parent}"
    return children


@pytest.fixture
def short_temporary_directory():
    """An empty directory under /tmp, short enough for MAX's socket paths (see `socket_directory`)."""
    directory = Path(tempfile.mkdtemp(prefix="max-gpt2-test-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="lists processes through /proc")
def test_a_server_whose_worker_dies_exits_with_the_cause_and_leaves_nothing_behind(
    served_lm, lm_checkpoint, compiled_lm, short_temporary_directory, tmp_path
):
    """While it runs, MAX's sockets (and its metrics') lie in the server's own directory under TMPDIR,
    and it renders chats with the built-in template it was given (`--chat-template chatml`: the
    checkpoint has none). When its worker processes die (killed here, as a crash would end them),
    the server does not linger answering nothing: it exits non-zero saying so, and then that
    directory and the shell that watched for the end are gone."""
    from max_gpt2.inference.tokenizer import load_tokenizer
    from max_gpt2.model.checkpoints.checkpoint import Checkpoint
    from max_gpt2.serving.chat_templates import TEMPLATES
    from tests.test_serve import client
    from tests.test_serve_api import greedy, render

    temporary = short_temporary_directory
    server = ServerProcess(
        lm_checkpoint(LM),
        tmp_path / "server.log",
        free_port(),
        "--device",
        "cpu",
        "--chat-template",
        "chatml",
        env={"TMPDIR": str(temporary)},
    )
    try:
        server.wait_until_ready(timeout=600)
        # ChatML's markers take 46 of LM's 48 positions in its small tokenizer: room for one new token.
        messages = [{"role": "user", "content": "hi"}]
        tokenizer = load_tokenizer(lm_checkpoint(LM))
        lm = compiled_lm(LM).with_weights(Checkpoint(lm_checkpoint(LM)).model_weights())
        prompt = tokenizer.encode(render(messages, (TEMPLATES / "chatml.jinja").read_text())).ids
        ids, pieces = greedy(lm, tokenizer, prompt, 1)
        chat = client(server).chat.completions.create(
            model="gpt2",
            messages=messages,
            temperature=0,
            max_tokens=1,
            extra_body={"return_token_ids": True},
        )
        assert chat.usage.prompt_tokens == len(prompt)
        assert chat.choices[0].message.content == "".join(pieces)
        assert chat.choices[0].model_extra["token_ids"] == ids
        (own,) = temporary.iterdir()
        assert (own / "metrics.sock").is_socket()
        assert own.name.startswith("max-gpt2-serve-")
        assert any(stat.S_ISSOCK(entry.lstat().st_mode) for entry in own.iterdir()), list(own.iterdir())
        assert processes_naming(str(own))  # the watching shell
        for worker in spawned_children(server.process.pid):
            with contextlib.suppress(ProcessLookupError):  # gone already: its sibling's death took it
                os.kill(worker, signal.SIGKILL)
        assert server.process.wait(timeout=120) != 0
        assert "Worker crashed" in server.tail(), server.tail()
    finally:
        server.stop()
    deadline = time.monotonic() + 15
    while (list(temporary.iterdir()) or processes_naming(str(temporary))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(temporary.iterdir()) == []
    assert processes_naming(str(temporary)) == []


def test_a_port_in_use_is_refused_before_the_server_starts(lm_checkpoint):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run_python("-m", "max_gpt2", "serve", "--checkpoint", lm_checkpoint(LM), "--port", str(port))
    assert result.returncode == 2
    assert f"max-gpt2 serve: error: --port {port}: the port is in use" in result.stderr
