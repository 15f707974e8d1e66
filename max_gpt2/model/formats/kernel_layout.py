"""The kernels' layout of packed weights: 8 rows interleaved, so a decoding step reads each group of 8 rows
as one stream of memory, not 8 (docs/performance.md). N is padded with zero rows to a multiple of 8.

    bfloat16     uint16 [N8 / 8, Kp * 8]   group g, chunk c, row r, element e (0..31), K padded to
                                           a multiple of 32: at c * 256 + r * 32 + e: W[8g + r, 32c + e]
    q8_0 values  int8 [N8 / 8, Kb * 256]   group g, block b, chunk c, row r, element e:
                                           at (b * 8 + c) * 32 + r * 4 + e: q[8g + r, 32b + 4c + e]
    q4_0 values  uint8 [N8 / 8, Kb * 128]  at (b * 4 + c) * 32 + r * 4 + e: q[8g + r, 32b + 4c + e]
                                           in the low nibble, q[8g + r, 32b + 16 + 4c + e] in the high
    scales       float16 [N8 / 8, Kb * 8]  at b * 8 + r: d[8g + r, b]

q8_0 and q4_0 also put 4 consecutive values of each of the 8 rows in one register. Block data comes
in as GGUF's (`block_quants.BlockCode.to_blocks`): `interleave_blocks` is a shuffle of its bytes.

llama.cpp's types read by their fields (q4_1, q5_0, q5_1 and the K-quants q4_k, q5_k, q6_k:
`max_gpt2/kernels/packed_layout.mojo` has their byte map) keep a group's block (super-block) as
one run of bytes: each field of the rows' blocks (their q, 5th bits, scales, mins) with the 8 rows
side by side at one axis of it (`group_field`), the fields one after another.
"""

from __future__ import annotations

import numpy as np

from max_gpt2.model.formats.block_quants import BlockCode

GROUP = 8  # rows stored interleaved
CHUNK = 32  # consecutive bfloat16 values of a row stored together (a 64-byte cache line)


def _grouped(
    source: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, order: tuple[int, ...]
) -> np.ndarray:
    """`source` [N, ...] with its rows in groups of 8, zero rows padding the last: one copy into an
    array of `shape` [G, ...] whose axes `order` puts as [G, r, ...]."""
    stored = np.zeros(shape, dtype)
    view = stored.transpose(order)  # [G, r, ...]
    full = source.shape[0] // GROUP
    view[:full] = source[: full * GROUP].reshape(full, GROUP, *source.shape[1:])
    if full < shape[0]:
        view[full, : source.shape[0] - full * GROUP] = source[full * GROUP :]
    return stored


def interleave_blocks(data: np.ndarray, code: BlockCode) -> tuple[np.ndarray, np.ndarray]:
    """GGUF's blocks [N, Kb * block_bytes] -> the kernel's values and scales (module docstring): a shuffle
    of their bytes. A nibble-packed block's byte j already holds values j and j + 16, as the kernel's."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, code.block_bytes)
    count, groups = blocks.shape[1], -(-rows // GROUP)
    chunks = 4 if code.nibbles else 8  # of 4 bytes a block
    values = blocks[..., 2:].view(code.dtype).reshape(rows, count, chunks, 4)
    stored = _grouped(values, (groups, count, chunks, GROUP, 4), code.dtype, (0, 3, 1, 2, 4))
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
    stored_scales = _grouped(scales, (groups, count, GROUP), np.float16, (0, 2, 1))
    return stored.reshape(groups, -1), stored_scales.reshape(groups, -1)


def interleave_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns [N, K] -> the kernel's layout, uint16 [N8 / 8, Kp * 8] (module docstring)."""
    rows, columns = bits.shape
    groups, chunks = -(-rows // GROUP), -(-columns // CHUNK)
    if columns % CHUNK:
        padded = np.zeros((rows, chunks * CHUNK), np.uint16)
        padded[:, :columns] = bits
        bits = padded
    chunked = bits.reshape(rows, chunks, CHUNK)
    stored = _grouped(chunked, (groups, chunks, GROUP, CHUNK), np.uint16, (0, 2, 1, 3))  # [g, c, r, e]
    return stored.reshape(groups, -1)


def deinterleave_bfloat16(stored: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """The inverse of `interleave_bfloat16`: bit patterns [rows, columns]."""
    groups, chunks = stored.shape[0], stored.shape[1] // (GROUP * CHUNK)
    bits = stored.reshape(groups, chunks, GROUP, CHUNK).transpose(0, 2, 1, 3)  # [g, r, c, e]
    return bits.reshape(groups * GROUP, chunks * CHUNK)[:rows, :columns]


def deinterleave_blocks(
    stored: np.ndarray, stored_scales: np.ndarray, code: BlockCode, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `interleave_blocks`, to row-layout values [rows, Kp] and scales [rows, Kb]."""
    groups, blocks = stored_scales.shape[0], stored_scales.shape[1] // GROUP
    scales = stored_scales.reshape(groups, blocks, GROUP).transpose(0, 2, 1).reshape(-1, blocks)
    if not code.nibbles:
        values = stored.reshape(groups, blocks, 8, GROUP, 4).transpose(0, 3, 1, 2, 4)
    else:
        nibbles = stored.reshape(groups, blocks, 4, GROUP, 4).transpose(0, 3, 1, 2, 4)  # [g, r, b, c, e]
        values = np.stack([nibbles & 0xF, nibbles >> 4], axis=3)  # [g, r, b, half, c, e]
    return values.reshape(groups * GROUP, -1)[:rows], scales[:rows]


def _field_axes(
    groups: int, blocks: int, inner: tuple[int, ...], tail: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A field's stored shape [G, Kb, *head, 8, *last] (`last` the final `tail` axes of `inner`) and the
    axis order that views it as [G, r, Kb, *inner]."""
    head, last = inner[: len(inner) - tail], inner[len(inner) - tail :]
    at = 2 + len(head)  # the rows' axis in the stored array
    return (groups, blocks, *head, GROUP, *last), (0, at, *range(1, at), *range(at + 1, at + 1 + tail))


def group_field(field: np.ndarray, tail: int) -> np.ndarray:
    """A field of N rows' blocks, [N, Kb, *inner], as the kernels store it: [G, Kb, bytes], the
    group's 8 rows side by side before the last `tail` axes of `inner` (zero rows padding N)."""
    rows, blocks, *inner = field.shape
    groups = -(-rows // GROUP)
    shape, order = _field_axes(groups, blocks, tuple(inner), tail)
    return _grouped(field, shape, field.dtype, order).reshape(groups, blocks, -1)


def ungroup_field(stored: np.ndarray, inner: tuple[int, ...], tail: int, rows: int) -> np.ndarray:
    """The inverse of `group_field`: stored [G, Kb, bytes] -> the field [rows, Kb, *inner]."""
    groups, blocks = stored.shape[:2]
    shape, order = _field_axes(groups, blocks, inner, tail)
    view = stored.reshape(shape).transpose(order)  # [G, r, Kb, *inner]
    return view.reshape(groups * GROUP, blocks, *inner)[:rows]
