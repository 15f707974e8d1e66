"""The accelerator proven in one lease (`make gpu-proof`): attention, the whole LM, the server and decoding
speed on a GPU, each result written as soon as it is known. docs/gpu.md says how to run it on a lent
machine.

    python benchmarks/gpu_proof --out DIR                        # where MAX sees a GPU
    python benchmarks/gpu_proof --out DIR --dry-run              # the same on the CPU, tiny shapes
    python benchmarks/gpu_proof --precompile DIR                 # GPU graphs compiled here, no GPU
    python benchmarks/gpu_proof --out OUT --precompiled DIR      # ... and read there

Stages, in order of importance (`gpu_proof.correctness`, `.serving`, `.speed`):

1. attention-float32, attention-bfloat16: `GPT2Attention` at GPT-2 small's and xl's widths against
   the float64 reference.
2. lm: a GPT-2-small-shaped checkpoint (random weights): float32 greedy tokens, cached steps and
   logits against the reference, bfloat16 logits within `verify`'s tolerance.
3. serve: `max-gpt2 serve` on it through the OpenAI client.
4. speed: decode tokens/s at batch 1 and 16 and a 512-token prompt's first token, ours beside
   Hugging Face's `generate`, with the bandwidth limit; once the others end, or `SPEED_SECONDS`
   before the budget does.

The first four run side by side, each in a process of its own (compiling is what a lease runs
short of, and MAX compiles a graph on few cores), at most `--jobs` at once. A stage that dies of a
signal while reading precompiled graphs runs once more compiling them. At `--budget` seconds
what still runs is stopped and marked so. Written under OUT as it happens (`gpu_proof.record`):
results.jsonl, summary.md, proof.log (every stage's output), server.log. Exit status 0 only if
no check failed and every stage finished.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the checkout's max_gpt2, wherever this runs from
sys.path.insert(0, str(HERE.parent))  # gpu_proof

from gpu_proof import correctness, precompiled, serving, speed  # noqa: E402 (after the path above)
from gpu_proof.plan import FULL, TINY, Plan  # noqa: E402 (after the path above)
from gpu_proof.record import FAILED, Results, read_results  # noqa: E402 (after the path above)
from max_gpt2.testing import write_checkpoint  # noqa: E402 (after the path above)

if TYPE_CHECKING:
    from max.driver import Device

STAGES = ("attention-float32", "attention-bfloat16", "lm", "serve", "speed")
SPEED_SECONDS = 120  # the speed stage starts by the budget's last this many seconds, whatever still runs
STOP_GRACE = 15  # seconds a stopped stage has to end (and stop its server) before it is killed


def run_stage(args: argparse.Namespace, plan: Plan) -> int:
    """One stage, in this process."""
    results = Results(args.out, args.stage, args.start)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{args.stage} stopped at the limit"))
    precompiled.use(args.precompiled)
    checkpoint = args.work / "checkpoint"
    try:
        if args.stage.startswith("attention-"):
            correctness.attention(plan, args.stage.removeprefix("attention-"), results)
            if args.stage == "attention-float32" and args.precompiled:
                precompiled.compile_to_compare(results, plan)
        elif args.stage == "lm":
            correctness.language_model(plan, results, checkpoint)
        elif args.stage == "serve":
            serving.serve(plan, results, checkpoint, args.out / "server.log", args.start + args.budget)
        else:
            speed.speed(plan, results, checkpoint, args.running)
    except Exception as error:
        traceback.print_exc()
        results.record(args.stage, "error", error=precompiled.first_line(error))
        return 1
    return 0


class Stage:
    """A stage's process (a session of its own), its output copied line by line to ours and proof.log."""

    def __init__(
        self, name: str, command: list[str], extra: tuple[str, ...], log: TextIO, lock: threading.Lock
    ) -> None:
        self.name, self.extra = name, extra  # extra: the stage's own options, for a second run
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ),  # MAX rewrites this process's C environment (PYTHONPATH)
            start_new_session=True,
        )
        self.pump = threading.Thread(target=self._copy, args=(log, lock), daemon=True)
        self.pump.start()

    def _copy(self, log: TextIO, lock: threading.Lock) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with lock:
                print(f"[{self.name}] {line.rstrip()}", flush=True)
                log.write(f"[{self.name}] {line.rstrip()}\n")
                log.flush()

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (the stage stops its server), SIGKILL to its group after `STOP_GRACE` seconds."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.pump.join(5)


def run(args: argparse.Namespace, plan: Plan) -> int:
    """Every stage, side by side, within the budget; the summary printed at the end."""
    from max.driver import accelerator_count

    from max_gpt2.bench.harness import machine_description
    from max_gpt2.inference.devices import resolve_device

    if plan.device == "gpu" and accelerator_count() == 0:
        print("MAX sees no accelerator here; --dry-run rehearses the proof on the CPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("results.jsonl", "summary.md", "proof.log", "server.log"):
        (args.out / name).unlink(missing_ok=True)
    start = time.time()
    results = Results(args.out, "setup", start)
    device = resolve_device(plan.device)
    results.record("machine", "done", device=device_label(device), machine=machine_description(device))
    with (
        tempfile.TemporaryDirectory(prefix="gpu-proof-") as scratch,
        (args.out / "proof.log").open("w") as log,
    ):
        work = Path(scratch)
        results.timed(
            "write the LM checkpoint",
            lambda: write_checkpoint(work / "checkpoint", plan.lm, seed=0, tokenizer=True),
        )
        common = [
            "--out",
            str(args.out),
            "--work",
            str(work),
            "--start",
            str(start),
            "--budget",
            str(args.budget),
        ]
        common += ["--dry-run"] if args.dry_run else []
        lock = threading.Lock()

        def launch(name: str, *extra: str, compiled_here: bool = False) -> Stage:
            reading = (
                [] if args.precompiled is None or compiled_here else ["--precompiled", str(args.precompiled)]
            )
            command = [sys.executable, str(HERE), "--stage", name, *common, *reading, *extra]
            return Stage(name, command, extra, log, lock)

        waiting, stages, retried = [name for name in STAGES if name != "speed"], [], set()
        speed_stage = None
        try:
            while (elapsed := time.time() - start) < args.budget:
                for index, stage in enumerate(stages):
                    code = stage.process.poll()
                    if code is not None and code < 0 and args.precompiled and stage.name not in retried:
                        died = f"signal {-code} with precompiled graphs: once more, compiling them"
                        Results(args.out, stage.name, start).record(stage.name, "note", died=died)
                        retried.add(stage.name)
                        stages[index] = launch(stage.name, *stage.extra, compiled_here=True)
                busy = [stage for stage in stages if stage.running()]
                while waiting and len(busy) < args.jobs:
                    stages.append(launch(waiting.pop(0)))
                    busy.append(stages[-1])
                if speed_stage is None and (
                    (not busy and not waiting) or elapsed >= args.budget - SPEED_SECONDS
                ):
                    speed_stage = launch("speed", "--running", ",".join(stage.name for stage in busy))
                    stages.append(speed_stage)
                if speed_stage is not None and not any(stage.running() for stage in stages):
                    break
                time.sleep(1)
        finally:
            for stage in stages:
                if stage.running():
                    stage.stop()
                    reason = f"still running at the {args.budget:.0f} s limit"
                    Results(args.out, stage.name, start).record(stage.name, "stopped", reason=reason)
            for name in [*waiting, *([] if speed_stage else ["speed"])]:
                reason = f"not started within the {args.budget:.0f} s limit"
                Results(args.out, name, start).record(name, "stopped", reason=reason)
    failed = [entry for entry in read_results(args.out) if entry["status"] in FAILED]
    results.record("whole run", "done", seconds=round(time.time() - start, 1))
    print((args.out / "summary.md").read_text())
    return 1 if failed else 0


def device_label(device: Device) -> str:
    from max_gpt2.inference.devices import device_name

    return device_name(device) if device.is_host else f"{device_name(device)} ({device.architecture_name})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_proof", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the results (made if missing)")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, the test suite's tiny shapes")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds before every stage is stopped")
    parser.add_argument("--jobs", type=int, default=4, help="stages compiling at once (default 4)")
    parser.add_argument("--precompiled", type=Path, metavar="DIR", help="graphs written by --precompile")
    parser.add_argument(
        "--precompile", type=Path, metavar="DIR", help="compile the GPU graphs here into DIR, and run nothing"
    )
    parser.add_argument("--architecture", default="sm_90a", help="the GPU --precompile compiles for")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # one stage, in this process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--running", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.running = [name for name in args.running.split(",") if name]
    plan = TINY if args.dry_run else FULL
    if args.precompile:
        precompiled.precompile(args.precompile, plan, args.architecture)
        return 0
    if args.out is None:
        parser.error("--out DIR: where the results go")
    return run_stage(args, plan) if args.stage else run(args, plan)


if __name__ == "__main__":
    sys.exit(main())
