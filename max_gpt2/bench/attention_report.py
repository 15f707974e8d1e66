"""How `max-gpt2 bench` shows its report (`max_gpt2.bench.attention`): a Markdown table of every
contender at every shape with its compile times, and a PNG of median time against sequence length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from max_gpt2.bench.report import cell, save_figure
from max_gpt2.outputs import require_matplotlib


def format_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table, plus compile times and what was skipped."""
    machine = report["machine"]
    peak = report["peak_gflops"]
    lines = [
        f"device {report['device']} ({machine.get('gpu') or machine['cpu']}, {machine['cores']} cores), "
        f"dtype {report['dtype']}, medians over {report['repeat']} interleaved rounds, "
        f"{report['peak_dtype']} matmul peak {cell(peak, '.0f')} GFLOP/s",
        "",
        "| model | batch x seq | impl | median ms | best ms | tokens/s | GFLOP/s | % of peak | vs SDPA "
        "| vs eager | peak extra MiB | matches reference |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["results"]:
        shape = f"{row['batch']}x{row['seq_len']}"
        if "error" in row:
            lines.append(f"| {row['model']} | {shape} | {row['impl']} | failed: {row['error']} ||||||||")
            continue
        fraction = row["fraction_of_peak"]
        lines.append(
            f"| {row['model']} | {shape} | {row['impl']} "
            f"| {row['seconds'] * 1e3:.2f} | {row['min_seconds'] * 1e3:.2f} "
            f"| {row['tokens_per_second']:,.0f} | {row['gflops']:.1f} "
            f"| {cell(None if fraction is None else 100 * fraction, '.0f')} "
            f"| {cell(row['speedup_vs_sdpa'], '.2f')} | {cell(row['speedup_vs_eager'], '.2f')} "
            f"| {cell(row['peak_extra_mib'], '.1f')} | {'yes' if row['matches_reference'] else 'NO'} |"
        )
    lines += ["", "compile seconds (first in this run / warm, cached / cold, empty cache):"]
    for model, impls in report["compile"].items():
        for impl, seconds in impls.items():
            cells = " / ".join(cell(seconds.get(kind), ".1f") for kind in ("first", "warm", "cold"))
            lines.append(f"  {model} {impl}: {cells}")
    lines += [f"skipped {name}: {reason}" for name, reason in report["skipped"].items()]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Median time against sequence length (batch-1 shapes), one panel per model; why not, if it can't."""
    try:
        plt = require_matplotlib()
    except ImportError as error:
        return str(error)
    plotted = [row for row in report["results"] if row["batch"] == 1 and "seconds" in row]
    models = list(dict.fromkeys(row["model"] for row in plotted))
    if not models:
        return "no batch-1 shape was measured (the plot is time against sequence length at batch 1)"
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for axis, model in zip(axes[0], models, strict=True):
        rows = [row for row in plotted if row["model"] == model]
        for impl in dict.fromkeys(r["impl"] for r in rows):
            points = sorted((r["seq_len"], r["seconds"] * 1e3) for r in rows if r["impl"] == impl)
            axis.plot(*zip(*points, strict=True), marker="o", label=impl)
        axis.set(xscale="log", yscale="log", xlabel="sequence length (batch 1)", ylabel="median ms")
        lengths = sorted({r["seq_len"] for r in rows})
        axis.minorticks_off()
        axis.set_xticks(lengths, [str(length) for length in lengths])
        axis.set_title(f"GPT-2 {model}, {report['device']} {report['dtype']}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    save_figure(plt, figure, path)
    return None
