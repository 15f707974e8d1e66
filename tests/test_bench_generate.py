"""`max-gpt2 bench-generate`: bookkeeping only, on the test suite's small LM (no timing is asserted)."""

from __future__ import annotations

import argparse
import io
import json

import numpy as np
import pytest

from max_gpt2.bench.bandwidth import weight_bytes_per_step
from max_gpt2.bench.generation import bench_model
from max_gpt2.bench.generation_contenders import Generator
from max_gpt2.cli import main
from max_gpt2.cli.bench_generate import parse_cases
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.model.formats import NAMED, Q4_0
from max_gpt2.model.parameters import is_packed
from max_gpt2.outputs import Progress
from tests.support import LM


@pytest.fixture(scope="module")
def report(lm_checkpoint, tmp_path_factory):
    """One run on LM's checkpoint, ours only, float32 and q8_0 weights: (exit code, report, output folder)."""
    output = tmp_path_factory.mktemp("bench-generate")
    argv = ["bench-generate", "--device", "cpu", "--models", "", "--checkpoint", str(lm_checkpoint(LM))]
    argv += ["--cases", "1x4+6,2x4+6,2x3+9", "--prefill", "16", "--rounds", "2", "--contenders", "max"]
    argv += ["--weight-format", "float32,q8_0"]
    code = main([*argv, "--output", str(output)])
    return code, json.loads((output / "bench-generate-cpu-float32.json").read_text()), output


def test_every_case_is_timed_against_the_bandwidth_limit(report):
    code, report, _ = report
    assert code == 0
    (model,) = report["models"].values()
    timed = [(row["contender"], row["weights"], row["case"]) for row in model["cases"]]
    assert sorted(timed) == sorted(
        (name, weights, case)
        for name, weights in (("max", "float32"), ("max-q8_0", "q8_0"))
        for case in ("1x4+6", "2x4+6", "2x3+9")
    )
    bandwidth = report["bandwidth_gb_per_second"] * 1e9
    limits = {
        weights: bandwidth / weight_bytes_per_step(LM, NAMED[weights]) for weights in ("float32", "q8_0")
    }
    assert model["limit_tokens_per_second"] == pytest.approx(limits)
    for row in model["cases"]:
        batch = int(row["case"].split("x")[0])
        assert row["prefill_ms"] > 0 and row["tokens_per_second"] > 0
        assert row["tokens_per_second"] == pytest.approx(np.median(row["round_tokens_per_second"]))
        # Each round against the bandwidth measured just before it; both rounds measured it.
        bandwidths = 1e9 * np.array(row["round_bandwidth_gb_per_second"])
        assert len(bandwidths) == 2 and (bandwidths > 0).all()
        each = np.array(row["round_tokens_per_second"]) * weight_bytes_per_step(LM, NAMED[row["weights"]])
        assert row["fraction_of_limit"] == pytest.approx(np.median(each / (bandwidths * batch)))
        if row["case"] == "2x4+6":  # beside 1x4+6: its rate over batch 1, round by round
            (alone,) = [
                r for r in model["cases"] if r["case"] == "1x4+6" and r["contender"] == row["contender"]
            ]
            each = np.array(row["round_tokens_per_second"]) / alone["round_tokens_per_second"]
            assert row["over_batch_1"] == pytest.approx(np.median(each))
        else:
            assert "over_batch_1" not in row
        if row["contender"] == "max":
            assert row["same_tokens_as_max"]
            assert set(row["speedup"]) == {"max-q8_0"}  # every other contender against it
            (other,) = [
                r for r in model["cases"] if r["case"] == row["case"] and r["contender"] == "max-q8_0"
            ]
            each = np.array(row["round_tokens_per_second"]) / other["round_tokens_per_second"]
            assert row["speedup"]["max-q8_0"] == pytest.approx(np.median(each))
    assert model["prefill"]["tokens"] == 16 and model["prefill"]["max"] > 0
    contexts = [context for context, _ in model["curve"]["max"]]
    assert contexts == sorted(contexts) and contexts[0] > 16 and contexts[-1] <= LM.n_positions
    assert report["machine"]["cores"] >= 1


def test_the_curve_is_plotted(report):
    _, _, output = report
    assert (output / "bench-generate-cpu-float32.png").read_bytes().startswith(b"\x89PNG")


def test_weight_bytes_count_every_tensor_a_step_reads(lm_checkpoint):
    weights = Checkpoint(lm_checkpoint(LM)).model_weights()
    embeddings = ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight")
    blocks_and_norm = sum(value.size for name, value in weights.items() if name not in embeddings)
    one_row_each = 2 * LM.n_embd
    assert weight_bytes_per_step(LM) == 4 * (blocks_and_norm + weights["lm_head.weight"].size + one_row_each)
    projections = sum(
        value.size for name, value in weights.items() if is_packed(name) and name not in embeddings
    )
    packed = projections + weights["lm_head.weight"].size + 8 * LM.n_embd  # a token's group of 8 wte rows
    rest = blocks_and_norm - projections + LM.n_embd  # and a row of wpe
    assert weight_bytes_per_step(LM, Q4_0) == round(packed * 18 / 32) + 4 * rest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--models", "huge"], "--models takes names from small, medium; got huge"),
        (["--contenders", "hf-sdpa"], "--contenders takes max and any of hf-eager, hf-sdpa; got hf-sdpa"),
        (["--models", ""], "nothing to time: give --models or --checkpoint"),
        (["--kv-cache", "float32,int8"], "--kv-cache takes float32 and float16; got int8"),
        (["--checkpoint", "gpt2-q4_k_m.gguf"], "--checkpoint gpt2-q4_k_m.gguf: a checkpoint directory"),
    ],
)
def test_bad_arguments_are_refused(args, message, capsys):
    assert main(["bench-generate", *args]) == 2
    assert message in capsys.readouterr().err


def test_cases_are_parsed(capsys):
    assert parse_cases("1x32+128, 8x4+2") == [(1, 32, 128), (8, 4, 2)]
    with pytest.raises(ValueError, match=r"--cases wants a list such as"):
        parse_cases("1x0+5")
    with pytest.raises(SystemExit):
        main(["bench-generate", "--cases", "1x"])
    assert "argument --cases: a list such as '1x32+128,8x32+128' (batch x prompt + new); got '1x'" in (
        capsys.readouterr().err
    )


def stand_in(name: str, tokens: np.ndarray) -> Generator:
    """A contender that 'generates' `tokens` whatever it is asked, one millisecond a token."""
    return Generator(
        name,
        NAMED["float32"],
        lambda ids, new: [0.001 * step for step in range(new + 1)],
        lambda ids: 0.001,
        lambda: None,
        lambda ids, new: tokens,
    )


@pytest.mark.parametrize(
    ("dtype", "on_host", "refused"),
    [("float32", True, True), ("float32", False, False), ("bfloat16", True, False)],
)
def test_other_tokens_from_hugging_face_stop_the_run_only_in_float32_on_the_host(
    lm_checkpoint, dtype, on_host, refused
):
    # On an accelerator our float32 products run on TF32 tensor cores; in half precision rounding may
    # tip a near-tie: there the difference is recorded, not refused.
    ours, theirs = np.zeros((1, 3), np.int64), np.ones((1, 3), np.int64)
    args = argparse.Namespace(
        cases=[(1, 2, 3)],
        rounds=1,
        bandwidth=1e9,
        round_bandwidth=lambda: 1e9,
        seed=0,
        prefill=0,
        curve=False,
        dtype=dtype,
        on_host=on_host,
    )
    generators = [stand_in("max", ours), stand_in("hf-sdpa", theirs)]
    if refused:
        with pytest.raises(ValueError, match="hf-sdpa generated other tokens than max"):
            bench_model("lm", lm_checkpoint(LM), generators, args, Progress(io.StringIO()))
        return
    report = bench_model("lm", lm_checkpoint(LM), generators, args, Progress(io.StringIO()))
    assert {row["contender"]: row["same_tokens_as_max"] for row in report["cases"]} == {
        "max": True,
        "hf-sdpa": False,
    }


def paced(name: str, rates: dict[int, list[float]], calls: list) -> Generator:
    """A contender decoding at rates[batch][n] tokens/s on its n-th call at that batch, recording each
    call's batch in `calls`."""
    made = {batch: 0 for batch in rates}

    def clocked(ids: np.ndarray, new: int) -> list[float]:
        batch = ids.shape[0]
        calls.append(batch)
        rate = rates[batch][made[batch]]
        made[batch] += 1
        return [0.0] + [0.001 + step * batch / rate for step in range(new)]

    return Generator(
        name, NAMED["float32"], clocked, lambda ids: 0.001, lambda: None, lambda ids, new: np.zeros((1, 1))
    )


def test_every_round_times_every_case_and_a_batch_is_divided_by_batch_1_round_by_round(lm_checkpoint):
    calls: list = []
    args = argparse.Namespace(
        cases=[(1, 2, 5), (4, 2, 5)],
        rounds=3,
        bandwidth=1e9,
        round_bandwidth=lambda: calls.append("probe") or 1e9,
        seed=0,
        prefill=0,
        curve=False,
        dtype="float32",
        on_host=True,
    )
    # Batch 1 at 100, 300, 200 tokens/s and batch 4 at 400, 900, 300: each round's ratio is 4, 3 and
    # 1.5 (median 3), where the medians' ratio would be 2.
    ours = paced("max", {1: [100.0, 300.0, 200.0], 4: [400.0, 900.0, 300.0]}, calls)
    report = bench_model("lm", lm_checkpoint(LM), [ours], args, Progress(io.StringIO()))
    assert calls == ["probe", 1, 4, "probe", 4, 1, "probe", 1, 4]  # a probe, then both cases, in turn
    rows = {row["case"]: row for row in report["cases"]}
    assert rows["1x2+5"]["round_tokens_per_second"] == pytest.approx([100, 300, 200])
    assert rows["4x2+5"]["round_tokens_per_second"] == pytest.approx([400, 900, 300])
    assert rows["4x2+5"]["over_batch_1"] == pytest.approx(3.0)
    assert "over_batch_1" not in rows["1x2+5"]
