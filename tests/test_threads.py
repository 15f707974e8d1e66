"""Restless helper threads (`max_gpt2.inference.threads`): found by how often they wake, moved to
SCHED_BATCH, and MAX's own one moved after a compiled model's first run on the CPU."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from max_gpt2.inference.threads import quiet_restless_threads, restless_threads
from tests.support import LM

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduler policies")


def policy(tid: int) -> int:
    return os.sched_getscheduler(tid)


def reset_every_thread() -> None:
    """Back to SCHED_OTHER, as a process starts (allowed without privilege from SCHED_BATCH)."""
    for tid in map(int, os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):  # ended meanwhile
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def test_a_thread_waking_thousands_of_times_a_second_is_moved_and_a_sleeping_one_is_not():
    stop = threading.Event()
    ids: dict[str, int] = {}

    def restless() -> None:
        ids["restless"] = threading.get_native_id()
        while not stop.is_set():
            time.sleep(0.0001)

    def sleeping() -> None:
        ids["sleeping"] = threading.get_native_id()
        stop.wait()

    workers = [threading.Thread(target=restless), threading.Thread(target=sleeping)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.05)
        reset_every_thread()
        moved = quiet_restless_threads()
        assert ids["restless"] in moved and policy(ids["restless"]) == os.SCHED_BATCH
        assert ids["sleeping"] not in moved and policy(ids["sleeping"]) == os.SCHED_OTHER
        assert threading.get_native_id() not in moved  # the caller is never moved
    finally:
        stop.set()
        for worker in workers:
            worker.join()


@contextlib.contextmanager
def every_core_busy():
    """A busy process per core, as when a build or the suite's compiles run beside us."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.parametrize("load", ["as the machine is", "every core busy"])
def test_a_models_first_run_on_the_cpu_moves_maxs_restless_thread(compiled_lm, lm_weights, load):
    reset_every_thread()
    with every_core_busy() if load == "every core busy" else contextlib.nullcontext():
        lm = compiled_lm(LM).with_weights(lm_weights(LM))  # a fresh instance: it has not moved any yet
        lm.logits(np.zeros((1, 4), np.int64))
        found = restless_threads(seconds=0.5)
    assert found, "MAX no longer keeps a restless thread: max_gpt2.inference.threads has no work"
    assert all(policy(tid) == os.SCHED_BATCH for tid in found)
