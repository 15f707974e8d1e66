"""How we decide that a MAX result agrees with the float64 NumPy reference.

The error is relative to the output's scale: max |result - reference| / max |reference|.
It must stay within the compute dtype's tolerance, widened in proportion to
the largest attention score once that exceeds `SCORE_SCALE`:

    tolerance = TOLERANCES[dtype] * max(1, largest |score| / SCORE_SCALE)

Why the widening: a score q . k / sqrt(d) carries a rounding error proportional
to its own size, and softmax passes that error straight to the output, so any
finite-precision computation (MAX, PyTorch, NumPy in float32) loses accuracy as
scores grow. Measured on CPU, MAX's float32 error tracks a float32 NumPy
computation of the same attention: about 1e-6 at scores up to 10, 3e-6 at 50,
2.5e-5 at 500. Activations of unit spread give scores up to about 10.

The base tolerances, and why:

- float32: 1e-5. The float32 unit roundoff is 6e-8; the longest dot products
  (n_embd terms in the projections, seq terms in the value sum) accumulate
  error that grows like sqrt(terms) in practice. Worst seen on CPU over the
  test shapes and seq up to 512 (scores up to 10): 5e-7 at width 60, 1.4e-6
  at 768, 2.4e-6 at 1600 (GPT-2 xl). 1e-5 leaves a 4x margin and still sits
  five orders of magnitude below what a wrong mask, head order or weight
  transpose produces.
- float16: 5e-3. Inputs, weights and intermediates are rounded to 11
  significant bits (unit roundoff 4.9e-4) at every step: worst seen 1.8e-3.
- bfloat16: 3e-2. Only 8 significant bits (unit roundoff 3.9e-3) at every
  step: worst seen 1.0e-2.
- tf32: 5e-3, float32 on an NVIDIA GPU (`precision`). MAX 26.7 runs float32
  matmuls there on TF32 tensor cores, which round both operands to 11
  significant bits (as float16 does) and sum in float32, with no way to opt
  out. Seen on an H200: GPT-2 small attention 5e-4 to 2.5e-3, the test LM's
  logits 9.4e-4.

Rerun the measurement with `python -m max_gpt2 verify --dtype DTYPE --json`
on any checkpoint, or the tests in `tests/test_attention.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from max_gpt2 import reference

TOLERANCES = {"float32": 1e-5, "tf32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2}
SCORE_SCALE = 10.0


def precision(dtype: str, on_accelerator: bool) -> str:
    """The `TOLERANCES` name a result computed in `dtype` is held to: "tf32" for float32 on a GPU."""
    return "tf32" if dtype == "float32" and on_accelerator else dtype


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The agreement between one MAX output and the reference."""

    max_abs_error: float
    relative_error: float
    tolerance: float
    largest_score: float

    @property
    def passed(self) -> bool:
        return self.relative_error <= self.tolerance


def compare(result: np.ndarray, expected: np.ndarray, dtype: str, largest_score: float = 0.0) -> Comparison:
    """Compares `result` with `expected` under `dtype`'s tolerance (a name in `TOLERANCES`).

    `largest_score` is the largest |attention score| behind `expected`; see the module docstring.
    """
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype must be one of {', '.join(TOLERANCES)}, got {dtype!r}")
    result = np.asarray(result, dtype=np.float64)
    if result.shape != expected.shape:
        raise ValueError(f"result shape {result.shape} differs from reference shape {expected.shape}")
    tolerance = TOLERANCES[dtype] * max(1.0, largest_score / SCORE_SCALE)
    if result.size == 0:
        return Comparison(0.0, 0.0, tolerance, largest_score)
    max_abs_error = float(np.max(np.abs(result - expected)))  # NaN propagates and fails
    scale = float(np.max(np.abs(expected)))
    relative_error = max_abs_error / scale if scale else max_abs_error
    return Comparison(max_abs_error, relative_error, tolerance, largest_score)


def check(
    result: np.ndarray, x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int, dtype: str
) -> Comparison:
    """Runs the reference on `x` and compares `result` with it."""
    expected, largest_score = reference.attention_and_largest_score(x, weights, n_head)
    return compare(result, expected, dtype, largest_score)
