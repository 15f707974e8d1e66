"""The GPU proof's dry run (`benchmarks/gpu_proof --dry-run`): every stage on the CPU at the suite's own
shapes, so the script a lent GPU runs cannot rot between leases.

It first precompiles its graphs into a store (`--precompile`, which on a GPU run happens on a
machine without one) and reads them from there, as a lease does. The fixtures compile the same
graphs first (attention ODD in float32 and bfloat16, LM, and LM's server, so these tests skip
where MAX's serving extra is missing), so the run compiles nothing new. Without PyTorch, Hugging
Face's contender reports itself skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import LM, ODD, run_python

PROOF = Path(__file__).parents[1] / "benchmarks" / "gpu_proof"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, compiled, compiled_lm, served_lm) -> tuple[Path, int, str]:
    compiled(ODD), compiled(ODD, "bfloat16"), compiled_lm(LM)  # served_lm: the serve stage's graphs
    store, out = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("proof")
    made = run_python(PROOF, "--dry-run", "--precompile", store)
    assert made.returncode == 0, made.stderr[-2000:]
    done = run_python(PROOF, "--dry-run", "--out", out, "--precompiled", store)
    return out, done.returncode, done.stdout + done.stderr


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_every_stage_checks_against_the_reference_and_passes(dry_run):
    out, code, output = dry_run
    entries = results(out)
    failed = [e for e in entries if e["status"] in ("fail", "error", "stopped")]
    assert code == 0 and not failed, (failed, output[-3000:])
    checks = {(e["stage"], e["check"]) for e in entries if e["status"] == "pass"}
    for stage in ("attention-float32", "attention-bfloat16", "lm"):
        assert any(s == stage for s, _ in checks), stage
    assert ("lm", "lm float32: greedy 24 tokens x 2 rows are the reference's choices") in checks
    skipped = {e["check"]: e["reason"] for e in entries if e["status"] == "skip"}
    assert "GPU" in skipped["lm bfloat16"]
    assert sum(stage == "serve" for stage, _ in checks) == 3


def test_graphs_come_from_the_store_and_every_step_is_timed(dry_run):
    out, _, _ = dry_run
    compiles = {e["check"]: e for e in results(out) if e["check"].startswith("compile ")}
    attention = [e for check, e in compiles.items() if check.startswith("compile attention") and "how" in e]
    assert len(attention) == 2 and all(e["how"] == "precompiled" for e in attention)
    assert "compile attention n_embd=60 float32 here too, to compare" in compiles
    assert all(e["seconds"] >= 0 for e in compiles.values())


def test_speed_is_measured_beside_the_bandwidth_limit(dry_run):
    out, _, _ = dry_run
    entries = {e["check"]: e for e in results(out) if e["stage"] == "speed"}
    assert entries["bandwidth"]["gb_per_second"] > 0
    for case in ("1x8+16", "16x8+16"):
        ours = entries[f"decode {case} max-float32"]
        assert 0 < ours["tokens_per_second"] < ours["limit"]
    assert entries["first token after a 1x40 prompt max-float32"]["ms"] > 0


def test_the_summary_lists_every_result(dry_run):
    out, _, output = dry_run
    summary = (out / "summary.md").read_text()
    for entry in results(out)[1:]:  # after the machine's description, which heads it
        assert entry["check"] in summary
    assert summary in output  # printed at the end too
    assert "0 failed or unfinished" in summary


def test_a_run_past_its_budget_marks_what_did_not_finish(tmp_path):
    # Three stages at a time: `serve`, fourth, never starts within the second; of those running
    # then, a fast machine with warm caches may finish `lm` in it, not both attention stages and
    # the speed stage as well.
    done = run_python(PROOF, "--dry-run", "--out", tmp_path, "--budget", "1", "--jobs", "3")
    assert done.returncode == 1
    stopped = {e["stage"]: e["reason"] for e in results(tmp_path) if e["status"] == "stopped"}
    assert stopped["serve"] == "not started within the 1 s limit"
    still_running = {stage for stage, reason in stopped.items() if reason.startswith("still running")}
    assert still_running & {"attention-float32", "attention-bfloat16", "speed"}
    assert "failed or unfinished" in (tmp_path / "summary.md").read_text()
