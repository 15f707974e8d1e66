"""Pictures of attention: a heatmap per head, query rows against key columns, on one colour scale.

    paths = draw_gallery(attentions, layers, tokens, summaries, Path("heads.png"))

`attentions` is one prompt's weights, `[layers, heads, seq, seq]`. Up to
`HEADS_PER_IMAGE` heads go into one PNG, a row per layer; more (GPT-2 small has
144) give one PNG per layer, `heads-layer0.png`, `heads-layer1.png`, ..., each
a grid of that layer's heads. Every heatmap uses the same 0-to-1 colour scale, so
colours compare across heads and images; each title names the layer, the head
and its label from `max_gpt2.analysis.head_summary`.

Each image is `grid_size(...)` pixels (fixed inches per heatmap at `DPI`), and is
written under a temporary name and renamed into place, so a reader never sees
half a file. Drawing needs matplotlib (`pip install 'max-gpt2[plot]'`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from max_gpt2.analysis.head_summary import HeadSummary
from max_gpt2.outputs import require_matplotlib, write_atomically

HEADS_PER_IMAGE = 48
CELL_INCHES = 2.6  # one heatmap, its title and tick labels
LEFT_INCHES, RIGHT_INCHES = 0.9, 1.0  # the query axis label and tick labels; the colour bar and its labels
TOP_INCHES, BOTTOM_INCHES = 0.3, 0.6  # the first row's titles; the key axis label
DPI = 100
MAX_TICK_LABELS = 32  # longer prompts label every n-th token only


def grid_shape(n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """(rows, columns) of each image: one image of layers x heads, or one per layer, heads near square."""
    if n_layers * n_heads <= HEADS_PER_IMAGE:
        return [(n_layers, n_heads)]
    columns = math.ceil(math.sqrt(n_heads))
    return [(math.ceil(n_heads / columns), columns)] * n_layers


def grid_size(rows: int, columns: int) -> tuple[int, int]:
    """The pixel (width, height) of an image holding a rows x columns grid of heatmaps."""
    width = columns * CELL_INCHES + LEFT_INCHES + RIGHT_INCHES
    return round(width * DPI), round((rows * CELL_INCHES + TOP_INCHES + BOTTOM_INCHES) * DPI)


def image_paths(out: Path, layers: list[int], n_heads: int) -> list[Path]:
    """`out` itself, or `out`'s stem with `-layerN` per layer when there is an image per layer."""
    if len(grid_shape(len(layers), n_heads)) == 1:
        return [out]
    return [out.with_name(f"{out.stem}-layer{layer}{out.suffix or '.png'}") for layer in layers]


def draw_gallery(
    attentions: np.ndarray, layers: list[int], tokens: list[str], summaries: list[HeadSummary], out: Path
) -> list[Path]:
    """Draws `attentions` `[layers, heads, seq, seq]` (rows numbered by `layers`); returns the PNGs written.

    `tokens` labels the axes (one string per position); `summaries` gives each
    head's label, found by layer and head number.
    """
    plt = require_matplotlib()
    n_layers, n_heads, seq_len, _ = attentions.shape
    labels = {(row.layer, row.head): row.label for row in summaries}
    paths = image_paths(out, layers, n_heads)
    shapes = grid_shape(n_layers, n_heads)
    per_image = [list(range(n_layers))] if len(paths) == 1 else [[index] for index in range(n_layers)]
    step = math.ceil(seq_len / MAX_TICK_LABELS)
    ticks = list(range(0, seq_len, step))
    for path, (rows, columns), indices in zip(paths, shapes, per_image, strict=True):
        width, height = (pixels / DPI for pixels in grid_size(rows, columns))  # inches
        figure = plt.figure(figsize=(width, height), dpi=DPI)
        grid = figure.add_gridspec(
            rows,
            columns,
            left=LEFT_INCHES / width,
            right=1 - RIGHT_INCHES / width,
            bottom=BOTTOM_INCHES / height,
            top=1 - TOP_INCHES / height,
            wspace=0.45,
            hspace=0.55,
        )
        image = None
        heads = [(index, head) for index in indices for head in range(n_heads)]
        for position, (index, head) in enumerate(heads):
            axis = figure.add_subplot(grid[divmod(position, columns)])
            image = axis.imshow(
                attentions[index, head], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest"
            )
            layer = layers[index]
            axis.set_title(f"layer {layer} head {head}\n{labels.get((layer, head), '')}", fontsize=7)
            axis.set_xticks(ticks, [tokens[i] for i in ticks], rotation=90, fontsize=5)
            axis.set_yticks(ticks, [tokens[i] for i in ticks], fontsize=5)
        figure.supxlabel("key (attended to)", fontsize=9)
        figure.supylabel("query (attending)", fontsize=9, x=0.1 / width)
        bar_left, bar_width = 1 - (RIGHT_INCHES - 0.15) / width, 0.12 / width
        colorbar_axis = figure.add_axes(
            (bar_left, BOTTOM_INCHES / height, bar_width, 1 - 2 * BOTTOM_INCHES / height)
        )
        figure.colorbar(image, cax=colorbar_axis, label="attention weight")
        write_atomically(path, lambda partial, figure=figure: figure.savefig(partial, format="png", dpi=DPI))
        plt.close(figure)
    return paths
