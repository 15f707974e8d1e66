"""What MAX's restless helper thread costs a decoding step, and what `SCHED_BATCH` gives back (Linux, CPU).

    python benchmarks/restless_thread.py [--rounds 8] [--tokens 96] [--batch 1]

Loads the benchmark checkpoint (GPT-2 small shapes) with `load_lm`; its first run
moves MAX's restless thread to `SCHED_BATCH` (`max_gpt2.inference.threads`). Then,
in alternated rounds in this one process, the moved threads are put back under
`SCHED_OTHER` (as MAX leaves them) or left under `SCHED_BATCH`, and a greedy
generation is timed: prints each policy's median step milliseconds per round, the
median over rounds, their ratio, and the involuntary context switches per round
(`getrusage`: each wake-up of the thread that preempts a worker is one).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import numpy as np

from max_gpt2.bench.generation import MODELS, demo_checkpoint_for
from max_gpt2.bench.harness import machine_description
from max_gpt2.inference.lm import load_lm
from max_gpt2.outputs import Progress, default_cache_dir

POLICIES = {"SCHED_OTHER": os.SCHED_OTHER, "SCHED_BATCH": os.SCHED_BATCH}


def moved_threads() -> list[int]:
    """This process's threads under `SCHED_BATCH` (those `quiet_restless_threads` moved)."""
    return [
        tid for tid in map(int, os.listdir("/proc/self/task")) if os.sched_getscheduler(tid) == os.SCHED_BATCH
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each policy (default: 8)")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens a round (default: 96)")
    parser.add_argument("--batch", type=int, default=1, help="rows generated together (default: 1)")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        print("Linux only: scheduler policies and /proc", file=sys.stderr)
        return 2
    progress = Progress(sys.stderr)
    lm = load_lm(demo_checkpoint_for("small", default_cache_dir(), progress), "cpu", "float32")
    ids = np.random.default_rng(0).integers(0, MODELS["small"].vocab_size, (args.batch, 32))
    lm.generate(ids, 8)  # the first run: MAX starts its thread, and the model moves it
    moved = moved_threads()
    if not moved:
        print("no restless thread was found to move: nothing to compare", file=sys.stderr)
        return 1
    print(machine_description(lm.device), f"threads moved: {moved}")
    steps: dict[str, list[float]] = {name: [] for name in POLICIES}
    switches: dict[str, list[int]] = {name: [] for name in POLICIES}
    for _ in range(args.rounds):
        for name, policy in POLICIES.items():
            for tid in moved:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            time.sleep(0.3)  # MAX's workers stop spinning after the last call: each round starts alike
            before = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
            times = [time.perf_counter()] + [time.perf_counter() for _ in lm.stream(ids, args.tokens)]
            switches[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - before)
            steps[name].append(1e3 * float(np.median(np.diff(times[2:]))))  # decoding steps only
    for name in POLICIES:
        rounds = " ".join(f"{ms:.1f}" for ms in steps[name])
        print(
            f"{name}: median step {statistics.median(steps[name]):.2f} ms (rounds: {rounds}); "
            f"involuntary switches a round {statistics.median(switches[name]):.0f}"
        )
    ratio = statistics.median(steps["SCHED_BATCH"]) / statistics.median(steps["SCHED_OTHER"])
    print(f"SCHED_BATCH / SCHED_OTHER: {ratio:.3f}x the time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
