"""How a benchmark publishes its results: JSON, a Markdown table on stdout, a PNG.

Every file is written atomically (`max_gpt2.outputs.write_atomically`), so an
interrupted run leaves the previous results whole rather than half of new ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from max_gpt2.outputs import write_atomically


def cell(value: Any, spec: str) -> str:
    """A table cell: `value` formatted by `spec`, or `-` where there is none."""
    return "-" if value is None else format(value, spec)


def save_figure(plt: Any, figure: Any, path: Path) -> None:
    """Lays `figure` out, writes it to `path` as PNG and closes it."""
    figure.tight_layout()
    write_atomically(path, lambda temporary: figure.savefig(temporary, format="png", dpi=110))
    plt.close(figure)


def publish(report: dict[str, Any], stem: Path, table: str, plot: Callable[[dict, Path], str | None]) -> None:
    """Writes `report` to `stem`.json and its plot to `stem`.png; prints the table and both paths."""
    json_path, png_path = stem.with_suffix(".json"), stem.with_suffix(".png")
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(json_path, lambda temporary: temporary.write_text(json.dumps(report, indent=2) + "\n"))
    print(table)
    print(f"\nresults: {json_path}")
    why_not = plot(report, png_path)
    print(f"plot: {png_path}" if why_not is None else f"plot skipped: {why_not}")
