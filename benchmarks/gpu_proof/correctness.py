"""Stages 1 and 2: the attention module and the whole language model against the float64 reference.

A greedy token that differs from the reference's passes only as a near tie: the two logits closer
than the dtype's tolerance lets either be off (`near_tie_bound`), both written down.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from gpu_proof.plan import Plan
from gpu_proof.precompiled import build
from gpu_proof.record import Results
from max_gpt2 import compile_attention, load_lm, reference
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import TOLERANCES, check, compare, precision


def attention(plan: Plan, dtype: str, results: Results) -> None:
    """`GPT2Attention` at each of `plan.attention`'s widths in `dtype` ("auto": MAX's flash kernel for
    bfloat16 on a GPU), each shape against the reference."""
    for config in plan.attention:
        width = f"n_embd={config.n_embd} n_head={config.n_head}"
        weights = random_attention_weights(config, seed=config.n_embd)
        compiled = build(
            results,
            f"attention {width} {dtype}",
            lambda c=config, w=weights: compile_attention(c, w, plan.device, dtype, "auto"),
        )
        for batch, length in plan.attention_shapes:
            x = np.random.default_rng(length).standard_normal((batch, length, config.n_embd), np.float32)
            start = time.perf_counter()
            result = compiled(x)
            seconds = time.perf_counter() - start
            comparison = check(result, x, weights, config.n_head, precision(dtype, plan.device != "cpu"))
            results.outcome(
                f"attention {width} {dtype} ({compiled.impl}) {batch}x{length}",
                comparison.passed,
                relative_error=f"{comparison.relative_error:.2e}",
                tolerance=f"{comparison.tolerance:.1e}",
                first_call_ms=round(seconds * 1e3, 2),
            )


def near_tie_bound(row: np.ndarray, tolerance: str) -> float:
    """How close two logits of `row` may be and still swap places within `tolerance` (a
    `verify.TOLERANCES` name): either may be off by the tolerance times the row's largest magnitude."""
    return 2 * TOLERANCES[tolerance] * float(np.max(np.abs(row)))


def left_padded_prompts(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Prompts of `plan.prompt_lengths` tokens: ids [rows, longest] (0 where padded) and their mask."""
    longest = max(plan.prompt_lengths)
    ids = np.random.default_rng(7).integers(1, plan.lm.vocab_size, (len(plan.prompt_lengths), longest))
    starts = longest - np.array(plan.prompt_lengths)[:, None]
    mask = (np.arange(longest)[None, :] >= starts).astype(np.int64)
    return ids * mask, mask


def language_model(plan: Plan, results: Results, checkpoint: Path) -> None:
    """float32: greedy tokens, cached steps, step logits; then each other dtype's logits. The greedy
    sequence goes to `checkpoint/../greedy.npy`."""
    weights = Checkpoint(checkpoint).model_weights()
    lm = build(results, "lm float32 (load_lm)", lambda: load_lm(checkpoint, plan.device, "float32"))
    tolerance = precision("float32", plan.device != "cpu")
    ids, mask = left_padded_prompts(plan)
    prompt = ids.shape[1]
    start = time.perf_counter()
    out = lm.generate(ids, plan.new_tokens, attention_mask=mask)  # [rows, prompt + new]
    seconds = time.perf_counter() - start
    np.save(checkpoint.parent / "greedy.npy", out)
    mask = np.concatenate([mask, np.ones((len(ids), plan.new_tokens), np.int64)], axis=1)
    cache = lm.new_cache(*out.shape)  # the steps again, each generated token fed back
    stepped = [lm.prefill(ids, cache, mask[:, :prompt])]
    stepped += [lm.decode_step(out[:, t], cache) for t in range(prompt, out.shape[1] - 1)]
    steps = np.stack(stepped, axis=1)  # [rows, new, vocab]: the logits each new token was chosen by
    recomputed = lm.logits(out[:, :-1], mask[:, :-1])[:, prompt - 1 :]
    same = compare(steps, recomputed.astype(np.float64), tolerance)
    results.outcome(
        "lm float32: cached steps equal recomputing the sequence",
        same.passed,
        relative_error=f"{same.relative_error:.2e}",
        tolerance=f"{same.tolerance:.1e}",
    )
    expected, largest_score = reference.lm_logits_and_largest_score(out, weights, plan.lm, mask)
    chosen_by = expected[:, prompt - 1 : -1]  # the reference's logits where each new token was chosen
    agree = compare(steps, chosen_by, tolerance, largest_score)
    results.outcome(
        "lm float32: step logits against the float64 reference",
        agree.passed,
        relative_error=f"{agree.relative_error:.2e}",
        tolerance=f"{agree.tolerance:.1e}",
    )
    ties, others = [], []
    new = out[:, prompt:]
    for row, t in zip(*np.nonzero(new != chosen_by.argmax(-1)), strict=True):
        theirs, ours = int(chosen_by[row, t].argmax()), int(new[row, t])
        difference = {
            "row": int(row),
            "step": int(t),
            "ours_and_reference": [ours, theirs],
            "reference_logits": [float(chosen_by[row, t, ours]), float(chosen_by[row, t, theirs])],
            "our_logits": [float(steps[row, t, ours]), float(steps[row, t, theirs])],
        }
        gap = difference["reference_logits"][1] - difference["reference_logits"][0]
        (ties if gap <= near_tie_bound(chosen_by[row, t], tolerance) else others).append(difference)
    results.outcome(
        f"lm float32: greedy {plan.new_tokens} tokens x {len(ids)} rows are the reference's choices",
        not others,
        differing=len(ties) + len(others),
        near_ties=ties,
        not_near_ties=others,
        tokens_per_second=round(new.size / seconds, 1),
    )
    del lm
    real = mask.astype(bool)
    for dtype in plan.dtypes[1:]:
        other = build(results, f"lm {dtype} (load_lm)", lambda d=dtype: load_lm(checkpoint, plan.device, d))
        logits = other.logits(out, mask)[real]
        comparison = compare(logits, expected[real], dtype, largest_score)
        results.outcome(
            f"lm {dtype}: logits at {int(real.sum())} positions against the float64 reference",
            comparison.passed,
            relative_error=f"{comparison.relative_error:.2e}",
            tolerance=f"{comparison.tolerance:.1e}",
            same_argmax=f"{np.mean(logits.argmax(-1) == expected[real].argmax(-1)):.3f}",
        )
    if plan.dtypes == ("float32",):
        results.record("lm bfloat16", "skip", reason="the GPU's compute dtype: not in the CPU dry run")


def first_difference(lm: Any, prompt: list[int], theirs: list[int], ours: list[int]) -> dict[str, Any]:
    """Where `theirs` first leaves `ours` (both greedy after `prompt`), with both tokens' logits there
    from `lm` and whether they are a near tie."""
    t = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), None)
    t = min(len(theirs), len(ours)) if t is None else t
    logits = lm.logits(np.array([prompt + ours[:t]]))[0, -1]
    pair = [theirs[t] if t < len(theirs) else None, ours[t] if t < len(ours) else None]
    found = [None if token is None else float(logits[token]) for token in pair]
    tolerance = precision("float32", not lm.device.is_host)
    tie = None not in found and abs(found[0] - found[1]) <= near_tie_bound(logits, tolerance)
    return {"step": t, "theirs_and_ours": pair, "our_logits": found, "near_tie": tie}
