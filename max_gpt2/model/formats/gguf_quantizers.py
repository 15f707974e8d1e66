"""llama.cpp's quantizers for its other block types, bit for bit (`registry` writes with these).

Each takes float32 weights [N, K] (K a whole number of blocks: 32 weights, or 256 for the K-quants)
and returns GGUF's blocks, uint8 [N, K / weights a block * bytes a block], the layouts `gguf_blocks`
decodes. They are llama.cpp's `quantize_row_*_ref`, what `llama-quantize` runs without an importance
matrix, in its float32 arithmetic and order: sums are accumulated one weight after another (the
groups laid out [weights, groups], reduced over the leading axis), `nearest_int` is its add-1.5*2^23
trick, float16 rounds to nearest even.

    Q4_1, Q5_1  d = (max - min) / 15 or 31, values rounded from (w - min) / d; d and min stored
    Q5_0        d = (the weight of largest magnitude) / -16, values w / d + 16
    Q4_K, Q5_K  per 32 weights a scale and a min found by `make_qkx2_quants` (a search over 21 or 16
                trial steps for the least weighted squared error), both rounded to 6 bits of the
                super-block's float16 d and dmin, then each weight rounded against them
    Q6_K        per 16 weights a scale found by `make_qx_quants` (19 trial steps), rounded to an int8
                of the super-block's float16 d, then each weight rounded against it, -32..31
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from max_gpt2.model.formats.block_quants import largest_magnitude
from max_gpt2.model.formats.gguf_blocks import SUPER

F = np.float32
CHUNK_WEIGHTS = 1 << 17  # weights quantized at a time, so the search's temporaries stay in cache
EPSILON = F(1e-15)  # GROUP_MAX_EPS: a group whose largest magnitude is below it is all zeros


def nearest_int(x: np.ndarray) -> np.ndarray:
    """llama.cpp's `nearest_int`: the low 23 bits of x + 1.5 * 2^23 in float32, as int32 (ties to even)."""
    shifted = (x.astype(F) + F(12582912.0)).view(np.int32)
    return (shifted & 0x007FFFFF) - 0x00400000


def _sequential_sum(terms: np.ndarray) -> np.ndarray:
    """Sums [m, n] over its first axis one row after another, in float32, as a C loop over a group's m
    weights adds them (NumPy reduces the leading axis of a C-ordered array row by row; along memory it
    sums pairwise)."""
    return np.ascontiguousarray(terms).sum(axis=0, dtype=F)


def _half(value: np.ndarray) -> np.ndarray:
    """float32 -> float16's bytes, uint8 [..., 2]."""
    return value.astype(np.float16)[..., None].view(np.uint8)


def _halved(value: np.ndarray) -> np.ndarray:
    """float32 rounded to float16 and back."""
    return value.astype(np.float16).astype(F)


def _blocks_of(
    quantize: Callable[[np.ndarray], np.ndarray], weights: int
) -> Callable[[np.ndarray], np.ndarray]:
    """A quantizer of blocks [n, `weights`] -> bytes [n, size] as one of rows [N, K] -> bytes
    [N, K / weights * size], `CHUNK_WEIGHTS` at a time."""

    def rows(weight: np.ndarray) -> np.ndarray:
        count, columns = weight.shape
        if columns % weights:
            raise ValueError(f"rows of {columns} weights are not whole blocks of {weights}")
        blocks = np.ascontiguousarray(weight, F).reshape(-1, weights)
        step = max(1, CHUNK_WEIGHTS // weights)
        out = [quantize(blocks[first : first + step]) for first in range(0, len(blocks), step)]
        return np.concatenate(out).reshape(count, -1)

    return rows


def _nibbles(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return (low.astype(np.uint8) & 0xF) | ((high.astype(np.uint8) & 0xF) << 4)


def _fifth_bits(values: np.ndarray) -> np.ndarray:
    """Values [n, 32] -> the little-endian word of their bit 4s, uint8 [n, 4]."""
    return np.packbits((values >> 4) & 1, axis=-1, bitorder="little")


def _min_max_blocks(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1's and Q5_1's rounding of blocks [n, 32]: values (w - min) / d + 0.5 truncated, d, min."""
    low, high = x.min(axis=-1), x.max(axis=-1)
    d = (high - low) / F(levels)
    inverse = np.divide(F(1), d, out=np.zeros_like(d), where=d != 0)
    values = np.trunc((x - low[:, None]) * inverse[:, None] + F(0.5)).astype(np.int32)
    return values, d, low


def _q4_1(x: np.ndarray) -> np.ndarray:
    values, d, low = _min_max_blocks(x, 15)
    values = np.minimum(15, values)
    return np.concatenate([_half(d), _half(low), _nibbles(values[:, :16], values[:, 16:])], axis=-1)


def _q5_1(x: np.ndarray) -> np.ndarray:
    values, d, low = _min_max_blocks(x, 31)
    values &= 0xFF  # a (uint8_t) cast
    parts = [_half(d), _half(low), _fifth_bits(values), _nibbles(values[:, :16], values[:, 16:])]
    return np.concatenate(parts, axis=-1)


def _q5_0(x: np.ndarray) -> np.ndarray:
    d = largest_magnitude(x) / F(-16)
    inverse = np.divide(F(1), d, out=np.zeros_like(d), where=d != 0)
    values = np.minimum(31, np.trunc(x * inverse[:, None] + F(16.5)).astype(np.int32))
    return np.concatenate([_half(d), _fifth_bits(values), _nibbles(values[:, :16], values[:, 16:])], axis=-1)


def _make_qkx2_quants(
    x: np.ndarray, weights: np.ndarray, levels: int, rmin: float, rdelta: float, steps: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`make_qkx2_quants` on groups [n, 32] with their weights: (values [n, 32] 0..levels, scale, -min).

    The groups are searched side by side, laid out [32, n]. Each trial step is taken from the best
    min found so far, as the C loop updates `min` in place."""
    x, weights = np.ascontiguousarray(x.T), np.ascontiguousarray(weights.T)  # [32, n]
    low = np.minimum(x.min(axis=0), F(0))  # [n]
    high = x.max(axis=0)
    flat = high == low
    sum_w, sum_x = _sequential_sum(weights), _sequential_sum(weights * x)

    def levels_at(iscale: np.ndarray, low: np.ndarray) -> np.ndarray:
        return np.clip(nearest_int(iscale * (x - low)), 0, levels).astype(F)

    def error(scale: np.ndarray, low: np.ndarray, values: np.ndarray) -> np.ndarray:
        return _sequential_sum(weights * np.square((scale * values + low) - x))

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F(levels) / (high - low)
        scale = F(1) / iscale
        values = levels_at(iscale, low)
        best = error(scale, low, values)
        for step in range(steps + 1):
            trial = levels_at(((F(rmin) + F(rdelta) * F(step)) + F(levels)) / (high - low), low)
            wl = weights * trial
            sum_l, sum_l2, sum_xl = _sequential_sum(wl), _sequential_sum(wl * trial), _sequential_sum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_min = np.where(positive, F(0), this_min)
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            trial_error = error(this_scale, this_min, trial)
            better = (det > 0) & (trial_error < best) & ~flat
            values = np.where(better, trial, values)
            best = np.where(better, trial_error, best)
            scale, low = np.where(better, this_scale, scale), np.where(better, this_min, low)
    values = np.where(flat, F(0), values).astype(np.int32).T
    return values, np.where(flat, F(0), scale), -low


def _k_quant(x: np.ndarray, levels: int, rmin: float, steps: int) -> tuple[np.ndarray, ...]:
    """Q4_K's and Q5_K's rounding of super-blocks [n, 256]: (values [n, 8, 32], 12 scale bytes, d, dmin)."""
    n = len(x)
    groups = x.reshape(n * 8, 32)
    average = np.sqrt(_sequential_sum(np.square(groups.T)) / F(32))
    values, scales, mins = _make_qkx2_quants(
        groups, average[:, None] + np.abs(groups), levels, rmin, 0.1, steps
    )
    values, scales, mins = values.reshape(n, 8, 32), scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale, max_min = np.maximum(scales.max(axis=-1), F(0)), np.maximum(mins.max(axis=-1), F(0))
    inverse_scale = np.divide(F(63), max_scale, out=np.zeros_like(max_scale), where=max_scale > 0)
    inverse_min = np.divide(F(63), max_min, out=np.zeros_like(max_min), where=max_min > 0)
    sixes = np.minimum(63, nearest_int(inverse_scale[:, None] * scales) & 0xFF)  # (uint8_t), then MIN
    six_mins = np.minimum(63, nearest_int(inverse_min[:, None] * mins) & 0xFF)
    d, dmin = max_scale / F(63), max_min / F(63)
    step = _halved(d)[:, None] * sixes.astype(F)  # [n, 8]
    offset = _halved(dmin)[:, None] * six_mins.astype(F)
    nonzero = step != 0
    safe = np.where(nonzero, step, F(1))[..., None]
    rounded = np.clip(nearest_int((x.reshape(n, 8, 32) + offset[..., None]) / safe), 0, levels)
    values = np.where(nonzero[..., None], rounded, values).astype(np.uint8)
    packed = np.empty((n, 12), np.uint8)
    packed[:, 0:4] = sixes[:, :4] | ((sixes[:, 4:] >> 4) << 6)
    packed[:, 4:8] = six_mins[:, :4] | ((six_mins[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sixes[:, 4:] & 0xF) | ((six_mins[:, 4:] & 0xF) << 4)
    return values, packed, d, dmin


def _runs(values: np.ndarray) -> np.ndarray:
    """Values [n, 8, 32] (low 4 bits) -> 128 bytes: run r holds sub-block 2r low, 2r + 1 high."""
    return _nibbles(values[:, 0::2], values[:, 1::2]).reshape(len(values), 128)


def _q4_k(x: np.ndarray) -> np.ndarray:
    values, packed, d, dmin = _k_quant(x, 15, -1.0, 20)
    return np.concatenate([_half(d), _half(dmin), packed, _runs(values)], axis=-1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    values, packed, d, dmin = _k_quant(x, 31, -0.5, 15)
    fifth = (values >> 4) & 1  # [n, 8 (s), 32 (l)]: bit s of byte l
    high = (fifth << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    return np.concatenate([_half(d), _half(dmin), packed, high, _runs(values)], axis=-1)


def _make_qx_quants(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """`make_qx_quants(m, levels, x, L, 1, NULL)` on groups [n, m]: (values [n, m] 0..2 * levels - 1, scale).

    The groups are searched side by side, laid out [m, n]."""
    largest = largest_magnitude(x)  # [n]
    zero = np.abs(largest) < EPSILON
    largest = np.where(zero, F(1), largest)
    x = np.ascontiguousarray(x.T)  # [m, n]
    weights = x * x
    weighted = weights * x

    def trial(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rounded = np.clip(nearest_int(iscale * x), -levels, levels - 1)
        level = rounded.astype(F)
        return rounded, _sequential_sum(weighted * level), _sequential_sum((weights * level) * level)

    values, sum_lx, sum_l2 = trial(F(-levels) / largest)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, F(0))
    best = scale * sum_lx
    for step in (*range(-9, 0), *range(1, 10)):
        rounded, sum_lx, sum_l2 = trial(-(F(levels) + F(0.1) * F(step)) / largest)
        better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
        values = np.where(better, rounded, values)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(better, sum_lx / sum_l2, scale)
        best = np.where(better, scale * sum_lx, best)
    return np.where(zero, 0, values + levels).T, np.where(zero, F(0), scale)


def _q6_k(x: np.ndarray) -> np.ndarray:
    n = len(x)
    values, scales = _make_qx_quants(x.reshape(n * 16, 16), 32)
    values, scales = values.reshape(n, 16, 16), scales.reshape(n, 16)
    largest = largest_magnitude(scales)
    zero = np.abs(largest) < EPSILON
    iscale = F(-128) / np.where(zero, F(1), largest)
    d = F(1) / iscale
    small = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)  # [n, 16]
    step = _halved(d)[:, None] * small.astype(F)
    nonzero = step != 0
    safe = np.where(nonzero, step, F(1))[..., None]
    rounded = np.clip(nearest_int(x.reshape(n, 16, 16) / safe), -32, 31) + 32
    values = np.where(nonzero[..., None], rounded, values).reshape(n, 2, 4, 32)  # [n, half, quarter, l]
    low = np.stack(
        [_nibbles(values[:, :, 0], values[:, :, 2]), _nibbles(values[:, :, 1], values[:, :, 3])], 2
    )
    top = values >> 4
    high = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)
    blocks = np.concatenate(
        [low.reshape(n, 128), high.astype(np.uint8).reshape(n, 64), small.view(np.uint8), _half(d)], axis=-1
    )
    blocks[zero] = 0
    return blocks


q4_1 = _blocks_of(_q4_1, 32)
q5_0 = _blocks_of(_q5_0, 32)
q5_1 = _blocks_of(_q5_1, 32)
q4_k = _blocks_of(_q4_k, SUPER)
q5_k = _blocks_of(_q5_k, SUPER)
q6_k = _blocks_of(_q6_k, SUPER)
