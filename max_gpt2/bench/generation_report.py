"""How `max-gpt2 bench-generate` shows its report (`max_gpt2.bench.generation`): a Markdown table of
the cases beside the bandwidth limit, and a PNG of decode tokens/s against context length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from max_gpt2.bench.report import save_figure
from max_gpt2.outputs import require_matplotlib


def format_table(report: dict[str, Any]) -> str:
    """The report as Markdown tables: the cases, then the prefill."""
    rounds = [
        bandwidth
        for result in report["models"].values()
        for row in result["cases"]
        for bandwidth in row["round_bandwidth_gb_per_second"]
    ]
    again = f", {min(rounds):.1f}-{max(rounds):.1f} GB/s before the rounds" if rounds else ""
    lines = [
        f"{report['device']} {report['dtype']}; bandwidth (a float32 LM head read) "
        f"{report['bandwidth_gb_per_second']:.1f} GB/s at the start ("
        + ", ".join(f"{name} {value:.1f}" for name, value in report["bandwidth_by_way_gb_per_second"].items())
        + f"){again}; medians of {report['rounds']} rounds, % of limit against each round's",
        "",
        "| model | case | contender | weights | prefill ms | decode tokens/s | x batch 1 | % of limit "
        "| vs max | vs llama.cpp, same weights | vs hf-sdpa | same tokens as max |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for model, result in report["models"].items():
        for row in result["cases"]:
            peers = ("max", f"llama.cpp-{row['weights']}", "hf-sdpa")
            ratios = [row["speedup"].get(peer) for peer in peers]
            same = {True: "yes", False: "no", None: "-"}[row["same_tokens_as_max"]]
            cells = [model, row["case"], row["contender"], row["weights"], f"{row['prefill_ms']:.1f}"]
            over = row.get("over_batch_1")
            cells += [f"{row['tokens_per_second']:.1f}", "-" if over is None else f"{over:.2f}x"]
            cells.append(f"{100 * row['fraction_of_limit']:.0f}")
            cells += ["-" if ratio is None else f"{ratio:.2f}x" for ratio in ratios]
            lines.append("| " + " | ".join([*cells, same]) + " |")
        for weights, limit in result["limit_tokens_per_second"].items():
            lines.append(f"| {model} | limit, batch 1 | | {weights} | | {limit:.1f} | | 100 | | | | |")
    prefills = {model: result["prefill"] for model, result in report["models"].items() if "prefill" in result}
    for model, prefill in prefills.items():
        timed = ", ".join(f"{name} {ms:.1f} ms" for name, ms in prefill.items() if name != "tokens")
        lines.append(f"\nprefill, {model}, 1 x {prefill['tokens']} tokens (every position's logits): {timed}")
    if "llama_cpp" in report:
        lines.append(
            f"\nllama.cpp: {report['llama_cpp']['binary']}, {report['llama_cpp']['threads']} threads"
        )
    lines += [f"skipped {name}: {reason}" for name, reason in report["skipped"].items()]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Decode tokens/s against context length, one panel per model; why not, if it can't."""
    curves = {model: result for model, result in report["models"].items() if "curve" in result}
    if not curves:
        return "no curve was measured (--no-curve)"
    try:
        plt = require_matplotlib()
    except ImportError as error:
        return str(error)
    figure, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.5), squeeze=False)
    for axis, (model, result) in zip(axes[0], curves.items(), strict=True):
        for name, points in result["curve"].items():
            axis.plot(*zip(*points, strict=True), marker=".", label=name)
        for weights, limit in result["limit_tokens_per_second"].items():
            axis.axhline(limit, color="gray", linestyle="--", label=f"bandwidth limit, {weights} weights")
        axis.set(xlabel="context length (tokens)", ylabel="decode tokens/s, batch 1", ylim=(0, None))
        axis.set_title(f"GPT-2 {model}, {report['device']} {report['dtype']}")
        axis.grid(True, alpha=0.3)
        axis.legend()
    save_figure(plt, figure, path)
    return None
