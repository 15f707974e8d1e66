"""A server change, A/B: this checkout's `max-gpt2 serve` against another checkout's, in one run.

    git worktree add /tmp/base HEAD~1          # the code to compare against
    python benchmarks/serving_ab.py /tmp/base --checkpoint DIR --pairs 16 --cases 1x2,16x1

Both servers run at once on the same checkpoint, each on its own port (the one not measured
idles), and client runs alternate between them, A B then B A: each pair's ratio (ours over the
baseline's tokens/s) is taken minutes apart at most, as the VM's speed moves by 10-30 % within
minutes. A case `CxR` is C clients each streaming R completions of `--max-tokens` tokens
(end-of-text ignored) after a `--prompt-tokens` prompt of the text we ship: greedy through
`/v1/completions`, or with `--route native` sampled through llama-server's `/completion` with its
defaults (`serving_clients.run_clients`). Reported per case: the median ratio, the middle half of the
ratios, and each side's median tokens/s; read a middle half that straddles 1 as no difference.
The checkpoint needs a tokenizer covering its vocabulary (the server refuses a smaller one):
a GPT-2 checkpoint with GPT-2's own `vocab.json` and `merges.txt`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from serving_clients import ROUTES, run_clients  # this folder's

from max_gpt2.bench.harness import machine_description, ratio_summary
from max_gpt2.bench.server import SOURCE_ROOT, free_port, stop_group, wait_for_health
from max_gpt2.inference.devices import resolve_device
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.testing import CORPUS


def start(root: Path, checkpoint: Path, port: int, log: Path) -> subprocess.Popen:
    """`max-gpt2 serve` from the checkout at `root` (its own package on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "max_gpt2", "serve", "--checkpoint", str(checkpoint), "--device", "cpu"]
    with log.open("w") as output:
        return subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=root,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path, help="the other checkout's root (holding max_gpt2/)")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=12, help="A/B pairs a case (default: 12)")
    parser.add_argument("--cases", default="1x2,16x1", help="CLIENTSxREQUESTS, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--route",
        choices=sorted(ROUTES),
        default="openai",
        help="openai: greedy /v1/completions; native: llama-server's /completion, sampled with its defaults",
    )
    args = parser.parse_args()
    cases = [tuple(int(part) for part in case.split("x")) for case in args.cases.split(",")]
    tokenizer = load_tokenizer(args.checkpoint)
    prompt = tokenizer.decode(tokenizer.encode(CORPUS.read_text()).ids[: args.prompt_tokens])
    print(machine_description(resolve_device("cpu")), flush=True)
    sides = {"ours": SOURCE_ROOT, "baseline": args.baseline.resolve()}
    ports = {name: free_port() for name in sides}
    while ports["ours"] == ports["baseline"]:
        ports["baseline"] = free_port()
    logs = Path(tempfile.mkdtemp(prefix="serving-ab-"))  # the servers' logs, outside both checkouts
    print(f"server logs: {logs}", flush=True)
    servers = {
        name: start(root, args.checkpoint, ports[name], logs / f"{name}.log") for name, root in sides.items()
    }
    try:
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        for name, url in urls.items():
            wait_for_health(url, servers[name], 1800)
            run_clients(url, "gpt2", 4, 1, prompt, 32, args.route)  # warm-up
        for clients, requests in cases:
            rates: dict[str, list[float]] = {name: [] for name in sides}
            for pair in range(args.pairs):
                for name in list(sides)[:: 1 if pair % 2 == 0 else -1]:
                    run = run_clients(
                        urls[name], "gpt2", clients, requests, prompt, args.max_tokens, args.route
                    )
                    rates[name].append(run["tokens_per_second"])
            ratios = [ours / base for ours, base in zip(rates["ours"], rates["baseline"], strict=True)]
            print(
                f"{clients} clients: ours / baseline {ratio_summary(ratios)}, {len(ratios)} pairs; "
                f"tokens/s ours {statistics.median(rates['ours']):.1f}, "
                f"baseline {statistics.median(rates['baseline']):.1f}",
                flush=True,
            )
    finally:
        for server in servers.values():
            stop_group(server.pid, server.poll)


if __name__ == "__main__":
    main()
