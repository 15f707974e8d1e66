"""How we decide that a MAX result agrees with the float64 NumPy reference.

The error is relative to the output's scale: max |result - reference| / max |reference|.
Tolerances per compute dtype, and why:

- float32: 1e-5. The float32 unit roundoff is 6e-8; the longest dot products
  (n_embd terms in the projections, seq terms in the value sum) accumulate
  error that grows like sqrt(terms) in practice. Worst seen on CPU over the
  test shapes and seq up to 512: 5e-7 at width 60, 1.4e-6 at 768, 2.4e-6 at
  1600 (GPT-2 xl). 1e-5 leaves a 4x margin and still sits five orders of
  magnitude below what a wrong mask, head order or weight transpose produces.
- float16: 5e-3. Inputs, weights and intermediates are rounded to 11
  significant bits (unit roundoff 4.9e-4) at every step: worst seen 1.8e-3.
- bfloat16: 3e-2. Only 8 significant bits (unit roundoff 3.9e-3) at every
  step: worst seen 1.0e-2.

Rerun the measurement with `python -m max_gpt2 verify --dtype DTYPE --json`
on any checkpoint, or the tests in `tests/test_attention.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

TOLERANCES = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The agreement between one MAX output and the reference."""

    max_abs_error: float
    relative_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.relative_error <= self.tolerance


def compare(result: np.ndarray, reference: np.ndarray, dtype: str) -> Comparison:
    """Compares `result` with `reference` under `dtype`'s tolerance (a name from `TOLERANCES`)."""
    result = np.asarray(result, dtype=np.float64)
    if result.shape != reference.shape:
        raise ValueError(f"result shape {result.shape} differs from reference shape {reference.shape}")
    if result.size == 0:
        return Comparison(0.0, 0.0, TOLERANCES[dtype])
    max_abs_error = float(np.max(np.abs(result - reference)))  # NaN propagates and fails
    scale = float(np.max(np.abs(reference)))
    relative_error = max_abs_error / scale if scale else max_abs_error
    return Comparison(max_abs_error, relative_error, TOLERANCES[dtype])
