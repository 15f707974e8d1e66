"""Where a load's seconds go, each start-up decision against what it replaced, in interleaved rounds.

    python benchmarks/startup_parts.py --checkpoint CKPT --weight-format q4_0 --rounds 5

Each part runs in a fresh process, both ways in turn each round (`harness.in_turn`); reported:
medians, and the median of each round's ratio (new over old):

    imports   what `load_lm` imports now, against the graph-building modules every import took
    graphs    the graphs read compiled from the artifact cache, against traced and found in MAX's cache
    weights   the weights mapped from the weights cache, against read as float32 and packed in memory
              (seconds, and the peak memory the step adds)

Run `max-gpt2 generate --checkpoint CKPT --weight-format F --tokens 464 --max-new-tokens 1` once first,
so that MAX's cache, the artifact cache and the weights cache hold what the new ways read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from max_gpt2.bench.harness import in_turn
from max_gpt2.bench.startup import cpu_description

MEASURE = """
def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024
start, before = time.perf_counter(), peak()
{body}
print(json.dumps({{"seconds": time.perf_counter() - start, "added_mb": peak() - before}}))
"""
SETUP = """
from max_gpt2.inference.lm_graphs import LMGraphs
from max_gpt2.inference.lm_options import LMOptions
from max_gpt2.model.checkpoints.checkpoint import open_checkpoint
from pathlib import Path
from max_gpt2.model.formats import format_named
checkpoint, weight_format = open_checkpoint(sys.argv[1]), format_named(sys.argv[2])
options = LMOptions.check("cpu", "float32", weight_format=weight_format)
def variants(graphs):
    return graphs.prompt_variant, graphs.step_variant
"""
PARTS = {
    "imports": (
        "from max_gpt2.inference.loading import load_lm",
        "import max_gpt2.inference.attention, max_gpt2.model.layers.gpt2",
    ),
    "graphs": (
        "g = LMGraphs(checkpoint.config, options); g.compile(*variants(g))",
        "g = LMGraphs(checkpoint.config, options, Path(sys.argv[3])); g.compile(*variants(g))",
    ),
    "weights": (
        "from max_gpt2.model.checkpoints.weights_cache import bound_weights\n"
        "w = bound_weights(checkpoint, weight_format)",
        "from max_gpt2.model.checkpoints.stored_weights import pack\n"
        "w = pack(checkpoint.model_weights(), weight_format)",
    ),
}


def run(part: str, way: int, args: argparse.Namespace) -> dict[str, float]:
    """One fresh process timing `part` the new way (0) or the old (1)."""
    setup = "" if part == "imports" else SETUP
    code = "import json, sys, time\n" + setup + MEASURE.format(body=PARTS[part][way])
    with tempfile.TemporaryDirectory() as empty:  # the old way's artifact cache: nothing kept
        command = [sys.executable, "-c", code, str(args.checkpoint), args.weight_format, empty]
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--weight-format", default="q4_0")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    before = os.getloadavg()[0]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(p, w): [] for p in PARTS for w in (0, 1)}
    for index in range(args.rounds):
        for part, way in in_turn(list(runs), index):
            runs[part, way].append(run(part, way, args))
    print(
        f"{args.checkpoint}, {args.weight_format}, {args.rounds} rounds, load average {before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; CPU (lscpu): {cpu_description()}\n"
    )
    print("| part | new s | old s | new / old | new adds MB | old adds MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for part in PARTS:
        new, old = runs[part, 0], runs[part, 1]
        ratio = median(n["seconds"] / o["seconds"] for n, o in zip(new, old, strict=True))
        print(
            f"| {part} | {median(r['seconds'] for r in new):.3f} | {median(r['seconds'] for r in old):.3f} "
            f"| {ratio:.3f} | {median(r['added_mb'] for r in new):.0f} "
            f"| {median(r['added_mb'] for r in old):.0f} |"
        )


if __name__ == "__main__":
    main()
