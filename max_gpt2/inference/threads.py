"""Keeps MAX's restless helper thread from preempting its compute workers (Linux).

At a process's first graph execution MAX 26.7 starts a thread that waits on a timed condition
variable and wakes about 6,000 times a second for as long as the process lives, busy or idle.
Where MAX has a worker on every core (its default), each wake-up preempts a worker in the
middle of a product: a decoding step takes an involuntary context switch per wake-up. Under
`SCHED_BATCH` the thread still runs, at its fair share, but no longer preempts on waking: most
of those switches go, and the steps are shorter (docs/performance.md).

MAX names no such thread and offers no setting for it, so it is found by what it does: a
thread of this process, other than the caller, that woke at least `WAKES_PER_SECOND` times in
a `SAMPLE_SECONDS` window. When other processes keep every core busy, MAX's thread gets the CPU
only once a scheduler tick and wakes ~250 times a second instead of ~6,000 (a CI run with the
suite's compiles beside it found nothing above 2,000 a second), so the bar sits below both and
above an idle thread's few wakes a second. MAX's workers sleep when no graph runs, so they are
not picked (and nothing is picked while a graph runs on another thread, which is why the caller
should be the one that runs graphs). Lowering one's own threads' policy needs no privilege.
Models call it through `AfterFirstRun`: each bound model (`compiled.BoundVariants.execute`) and
serving model after its first run on the host.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

SAMPLE_SECONDS = 0.03  # once a model, after its first run on the host
WAKES_PER_SECOND = 100  # MAX's thread: 250 to 6,000; an idle thread: under 20
TASKS = Path("/proc/self/task")


def voluntary_switches() -> dict[int, int]:
    """Each thread of this process (native id) and how often it has given up the CPU so far."""
    switches = {}
    for task in TASKS.iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended while we looked
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                switches[int(task.name)] = int(line.split()[1])
    return switches


def restless_threads(seconds: float = SAMPLE_SECONDS) -> list[int]:
    """Threads other than the caller's that woke at least `WAKES_PER_SECOND` times in `seconds`."""
    before = voluntary_switches()
    time.sleep(seconds)
    after = voluntary_switches()
    caller = threading.get_native_id()
    least = WAKES_PER_SECOND * seconds
    return [tid for tid, count in after.items() if tid != caller and count - before.get(tid, count) >= least]


def quiet_restless_threads() -> list[int]:
    """Moves the restless threads (`restless_threads`) to `SCHED_BATCH`; returns those moved.
    Does nothing where Linux's scheduler policies or /proc are missing."""
    if not (hasattr(os, "sched_setscheduler") and TASKS.is_dir()):
        return []
    moved = []
    for tid in restless_threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except OSError:  # ended meanwhile, or a policy this process may not change
            continue
        moved.append(tid)
    return moved


class AfterFirstRun:
    """`ran()` after each graph run of one model: the first on the host moves the restless threads,
    later ones and an accelerator's do nothing (MAX starts its thread at a process's first run)."""

    def __init__(self, on_host: bool) -> None:
        self._pending = on_host

    def ran(self) -> None:
        if self._pending:
            quiet_restless_threads()
            self._pending = False
