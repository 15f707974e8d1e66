"""The command line, end to end, on small checkpoints."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from max_gpt2 import Checkpoint, Sampler, cli, verify
from max_gpt2.cli import console
from max_gpt2.inference.stop_strings import cut
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.testing import write_checkpoint
from tests.support import GPT2_SMALL, LM, ODD, run_command, run_python


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "max_gpt2", *args, stdin=stdin)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt"), ODD, seed=3, layout="save_pretrained", shards=2)


def test_verify_json(compiled, checkpoint):
    compiled(ODD)  # puts the graph in MAX's cache, so the CLI's compile is quick
    done = run_cli(
        "verify",
        "--checkpoint",
        str(checkpoint),
        "--device",
        "cpu",
        "--json",
        "--batch",
        "3",
        "--seq-len",
        "9",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] and report["device"] == "cpu" and report["dtype"] == "float32"
    assert report["impl"] == "graph"  # what auto picks on CPU
    assert [row["layer"] for row in report["layers"]] == [0, 1, 2]
    assert all(row["relative_error"] < verify.TOLERANCES["float32"] for row in report["layers"])
    assert report["config"]["n_embd"] == ODD.n_embd and report["batch"] == 3 and report["seq_len"] == 9
    assert set(report["seconds"]) == {"load", "compile", "run", "reference"}
    assert "compiling attention for cpu float32" in done.stderr


def test_verify_the_flash_implementation(compiled, checkpoint):
    compiled(ODD, impl="flash")  # cached for the CLI, as above
    done = run_cli("verify", "--checkpoint", str(checkpoint), "--device", "cpu", "--impl", "flash", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] and report["impl"] == "flash" and len(report["layers"]) == ODD.n_layer


def test_demo_table_on_a_checkpoint(checkpoint):
    done = run_cli(
        "demo", "--checkpoint", str(checkpoint), "--device", "cpu", "--layers", "0,2", "--seq-len", "4"
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout.splitlines()
    assert any(line.split()[:1] == ["layer"] and "relative error" in line for line in table)
    rows = [line.split() for line in table if line.split()[:1] in (["0"], ["2"])]
    assert [row[0] for row in rows] == ["0", "2"] and all(row[-1] == "yes" for row in rows)
    assert "all layers agree with the reference" in done.stdout
    assert "compile" in done.stdout and "per layer" in done.stdout


def test_demo_without_arguments_makes_then_reuses_its_checkpoint(compiled, tmp_path):
    compiled(GPT2_SMALL)
    args = ("demo", "--device", "cpu", "--layers", "11", "--seq-len", "3", "--cache-dir", str(tmp_path))
    try:
        first = run_cli(*args)
        assert first.returncode == 0, first.stderr
        assert "writing a GPT-2-small-shaped checkpoint" in first.stderr
        assert (tmp_path / "gpt2-small-seed0" / "config.json").is_file()
        second = run_cli(*args)
        assert second.returncode == 0, second.stderr
        assert "reusing the demo checkpoint" in second.stderr
        assert "n_embd=768, n_head=12, n_layer=12" in second.stderr
    finally:
        shutil.rmtree(tmp_path / "gpt2-small-seed0", ignore_errors=True)  # 500 MB; pytest keeps tmp dirs


def test_a_disagreeing_layer_fails_the_run(compiled, checkpoint, monkeypatch, capsys):
    compiled(ODD)
    monkeypatch.setitem(verify.TOLERANCES, "float32", 0.0)  # nothing can pass a zero tolerance
    assert (
        cli.main(
            ["demo", "--checkpoint", str(checkpoint), "--device", "cpu", "--layers", "1", "--seq-len", "5"]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "MISMATCH" in out and out.splitlines()[4].split()[-1] == "NO"


def test_generate_reads_standard_input_and_ends_before_a_stop_string(compiled_lm, lm_checkpoint):
    lm, path = compiled_lm(LM), lm_checkpoint(LM)
    tokenizer, eos = load_tokenizer(path), Checkpoint(path).config.stop_token_ids
    prompt = tokenizer.encode("The cat").ids
    sampler = Sampler(do_sample=True, seed=4, repetition_penalty=1.3, logit_bias={7: -100})
    new = lm.generate(np.array([prompt]), 12, sampler=sampler, eos_token_id=eos)[0, len(prompt) :]
    text = tokenizer.decode(new.tolist(), skip_special_tokens=False)
    stop = text[4:6]
    options = [
        "--max-new-tokens",
        "12",
        "--seed",
        "4",
        "--repetition-penalty",
        "1.3",
        "--logit-bias",
        "7=-100",
    ]
    stops = ["--stop", stop, "--stop", "|x|"]
    done = run_cli(
        "generate", "--checkpoint", str(path), "--prompt-file", "-", *options, *stops, stdin="The cat"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The cat" + cut(text, [stop]) + "\n" and stop not in done.stdout[len("The cat") :]


def test_temperature_zero_is_greedy_as_llama_cpps_and_the_servers():
    from max_gpt2.cli.generate import sampler_of

    def sampler(*options: str) -> Sampler:
        return sampler_of(cli.build_parser("generate").parse_args(["generate", "--tokens", "1", *options]))

    assert sampler("--temperature", "0") == sampler() and not sampler().do_sample
    assert sampler("--temperature", "0.5").do_sample


def test_a_warning_is_one_line_once_though_the_options_are_checked_twice(lm_checkpoint):
    args = ["--tokens", "1,2", "--max-new-tokens", "2", "--length-penalty", "2"]
    done = run_cli("generate", "--checkpoint", str(lm_checkpoint(LM)), *args)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("max-gpt2: warning: num_beams is 1: length_penalty") == 1, done.stderr


def test_generate_prints_each_beam(compiled_lm, lm_checkpoint, tmp_path):
    lm, path = compiled_lm(LM), lm_checkpoint(LM)
    tokenizer, eos = load_tokenizer(path), Checkpoint(path).config.stop_token_ids
    (tmp_path / "prompt.txt").write_text("Once upon", encoding="utf-8")
    args = ["--prompt-file", str(tmp_path / "prompt.txt"), "--max-new-tokens", "6", "--num-beams", "3"]
    done = run_cli("generate", "--checkpoint", str(path), *args, "--num-return-sequences", "2")
    assert done.returncode == 0, done.stderr
    ids = np.array([tokenizer.encode("Once upon").ids])
    rows = lm.generate(ids, 6, eos_token_id=eos, num_beams=3, num_return_sequences=2)
    texts = [tokenizer.decode(row.tolist(), skip_special_tokens=False) for row in rows]
    assert done.stdout == f"[sequence 1]\n{texts[0]}\n[sequence 2]\n{texts[1]}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "/nonexistent/gpt2"], "no such file or directory: /nonexistent/gpt2"),
        (["--layers", "0,7"], r"--layers '0,7': the checkpoint has 3 layers \(0 to 2\)"),
        (["--layers", "first"], "--layers must be 'all' or a list"),
        (["--device", "tpu"], "device must be"),
        (["--layers", "2-1"], r"--layers '2-1': the range 2-1 runs backwards"),
        (["--seed", "-1"], "argument --seed: must be an integer of 0 or more, got -1"),
        (
            ["--seq-len", "10000000"],
            r"--batch 2 --seq-len 10000000: the float64 reference's attention scores \[2, 5, 10000000, "
            r"10000000\] alone take 8000000.0 GB, and this machine has",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(checkpoint, args, message):
    if "--checkpoint" not in args:
        args = ["--checkpoint", str(checkpoint), *args]
    done = run_cli("verify", *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "compiling" not in done.stderr
    assert re.search(message, done.stderr), done.stderr


def test_cache_dir_holds_what_generate_keeps(compiled_lm, lm_checkpoint, tmp_path):
    """`--cache-dir` is `load_lm(cache_dir=...)`: the converted weights and kept graphs go there."""
    compiled_lm(LM, weights="q4_0")  # MAX's cache holds the graphs: the load compiles in seconds
    args = ["--tokens", "5,6", "--max-new-tokens", "2", "--weight-format", "q4_0"]
    done = run_cli("generate", "--checkpoint", str(lm_checkpoint(LM)), *args, "--cache-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["digests", "graphs", "weights"]


@pytest.mark.parametrize("command", sorted(cli.HOST_ONLY))
def test_commands_that_compute_on_no_device_take_no_device_option(command, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser(command).parse_args([command, "--help"])
    shown = capsys.readouterr().out
    assert "--checkpoint" in shown and "--device" not in shown and "--dtype" not in shown


def test_parse_layers():
    assert console.parse_layers("all", 3) == [0, 1, 2]
    assert console.parse_layers("2, 0-1,1", 4) == [2, 0, 1]
    with pytest.raises(ValueError, match="has 4 layers"):
        console.parse_layers("3-5", 4)


@pytest.mark.parametrize("command", ["generate", "score", "perplexity", "serve", "bench-generate"])
def test_every_command_that_stores_weights_takes_weight_format(command):
    """`--weight-format` (by default the checkpoint's own; float32 for bench-generate's list); `--weights`,
    its spelling before 0.1, is gone."""
    required = {"generate": ["--prompt", "hi"], "score": ["--prompt", "hi"], "perplexity": ["a.txt"]}
    parser, given = cli.build_parser(), [command, *required.get(command, [])]
    assert parser.parse_args(given).weight_format == ("float32" if command == "bench-generate" else None)
    assert parser.parse_args([*given, "--weight-format", "q4_0"]).weight_format == "q4_0"
    with pytest.raises(SystemExit):
        parser.parse_args([*given, "--weights", "q4_0"])


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("max-gpt2")
    if not script.exists():
        pytest.skip("the package is not installed with its console script (pip install -e .)")
    done = run_command(script, "--help")
    assert done.returncode == 0 and "demo" in done.stdout and "verify" in done.stdout


# generate: text in, text out, on the test language model's shapes (its graph is cached first).


def test_generate_streams_the_text_that_generate_gives(compiled_lm, lm_checkpoint):
    lm = compiled_lm(LM)
    path = lm_checkpoint(LM)
    done = run_cli("generate", "--checkpoint", str(path), "--prompt", "The cat", "--max-new-tokens", "12")
    assert done.returncode == 0, done.stderr
    tokenizer = load_tokenizer(path)
    prompt = tokenizer.encode("The cat").ids
    expected = lm.generate(np.array([prompt]), 12)[0]
    assert done.stdout == tokenizer.decode(expected.tolist()) + "\n"
    assert re.search(rf"prefill: {len(prompt)} prompt tokens in [\d.]+ ms", done.stderr), done.stderr
    assert re.search(r"decode: 11 tokens in [\d.]+ s, [\d.]+ tokens/s", done.stderr), done.stderr


def generating(compiled_lm, lm_checkpoint) -> subprocess.Popen[bytes]:
    """A `max-gpt2 generate` of 5,000 tokens after "The cat", its prompt's text read back: generating now."""
    compiled_lm(LM)  # its graphs kept: the command starts at once
    args = ["--checkpoint", str(lm_checkpoint(LM)), "--prompt", "The cat", "--max-new-tokens", "5000"]
    process = subprocess.Popen(
        [sys.executable, "-m", "max_gpt2", "generate", *args, "--context-overflow", "shift"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(7) == b"The cat"
    return process


def test_a_reader_that_leaves_early_ends_generate_quietly(compiled_lm, lm_checkpoint):
    """`max-gpt2 generate ... | head -c 7`: the reader closes its end after the prompt's text; the next
    token's write ends the command with status 1 and no error line or traceback."""
    process = generating(compiled_lm, lm_checkpoint)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=600) == 1, stderr
    assert "error" not in stderr and "Traceback" not in stderr and "Exception" not in stderr, stderr


@pytest.mark.parametrize(("signal_sent", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_a_sigterm_ends_generate_with_one_line(compiled_lm, lm_checkpoint, signal_sent, status):
    """Interrupted while it generates: Ctrl-C says so in one line, a SIGTERM ends it as quietly; the
    status is the one a shell reports for the signal, and no traceback is printed."""
    process = generating(compiled_lm, lm_checkpoint)
    dispositions = [  # which signals it blocks, ignores and catches, should it not end
        line
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
        if line.startswith("Sig")
    ]
    process.send_signal(signal_sent)
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=600) == status, (stderr, dispositions)
    assert "Traceback" not in stderr and ("interrupted" in stderr) == (signal_sent == signal.SIGINT), stderr


def test_a_sigterm_while_a_file_is_written_leaves_no_partial_file(tmp_path):
    """The program's SIGTERM handler unwinds as an exception, so `write_atomically` removes what it wrote
    so far (the weights cache, `convert --out`), and `main` ends with status 143."""
    code = f"""
import os, signal, sys, time
from pathlib import Path
from max_gpt2.cli import Terminated, _terminated
from max_gpt2.outputs import write_atomically
signal.signal(signal.SIGTERM, _terminated)
def write(partial):
    partial.write_text("half")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
try:
    write_atomically(Path({str(tmp_path / "out.gguf")!r}), write)
except Terminated as ended:
    sys.exit(ended.status)
"""
    done = run_python("-c", code)
    assert done.returncode == 143, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_program_collects_nothing_while_it_imports_then_collects_again():
    """`run` pauses Python's collector while the command's modules (NumPy, MAX, ours) are imported and
    freezes what they made (start-up time, docs/performance.md); the command itself runs collected."""
    code = """
import gc, sys
from max_gpt2 import cli
collections = lambda: sum(generation["collections"] for generation in gc.get_stats())
before = collections()
def report(args, command):
    print(collections() - before, gc.isenabled(), gc.get_freeze_count(), "max.engine" in sys.modules)
    return 0
cli.execute = report
sys.argv = ["max-gpt2", "generate", "--tokens", "1"]
cli.run()
"""
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    during, enabled, frozen, imported = done.stdout.split()
    assert (during, enabled, imported) == ("0", "True", "True")
    assert int(frozen) > 10_000  # NumPy's, MAX's and our modules' objects


STDIN = ("--prompt-file", "-")


def test_a_prompt_on_standard_input_that_is_not_utf8_is_refused_naming_it(lm_checkpoint):
    done = subprocess.run(
        [sys.executable, "-m", "max_gpt2", "generate", "--checkpoint", str(lm_checkpoint(LM)), *STDIN],
        input=b"ok \xff\xfe",
        capture_output=True,
        env=dict(os.environ),
    )
    assert done.returncode == 2
    assert "--prompt-file -: 'utf-8' codec can't decode byte 0xff in position 3" in done.stderr.decode()


def test_generate_from_token_ids_without_a_tokenizer(compiled_lm, tmp_path):
    lm = compiled_lm(LM)
    path = write_checkpoint(tmp_path, LM, seed=0)  # the same weights as lm's, but no tokenizer files
    args = ["generate", "--checkpoint", str(path), "--tokens", "5,6,7", "--max-new-tokens", "6"]
    done = run_cli(*args, "--top-k", "3", "--seed", "11")
    assert done.returncode == 0, done.stderr
    expected = lm.generate(np.array([[5, 6, 7]]), 6, sampler=Sampler(do_sample=True, top_k=3, seed=11))[0]
    assert done.stdout == ",".join(map(str, expected)) + "\n"
    no_text = run_cli("generate", "--checkpoint", str(path), "--prompt", "hello")
    assert no_text.returncode == 2 and "has no tokenizer" in no_text.stderr and "--tokens" in no_text.stderr


def test_generate_with_drafts_prints_what_plain_decoding_prints(compiled_lm, tmp_path):
    lm = compiled_lm(LM)
    path = str(write_checkpoint(tmp_path, LM, seed=0))  # lm's weights, no tokenizer: ids are printed
    prompt = "5,6,7,8,9,5,6,7,8,9,5,6"
    expected = lm.generate(np.array([[int(t) for t in prompt.split(",")]]), 10)[0]
    for drafting in (["--prompt-lookup", "4"], ["--draft", path, "--draft-tokens", "3"]):
        done = run_cli(
            "generate", "--checkpoint", path, "--tokens", prompt, "--max-new-tokens", "10", *drafting
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ",".join(map(str, expected)) + "\n"
        counts = re.search(r"drafts: (\d+) tokens drafted, (\d+) accepted", done.stderr)
        assert counts, done.stderr
        drafted, accepted = int(counts[1]), int(counts[2])
        assert 0 < accepted <= drafted and (accepted == drafted or drafting[0] == "--prompt-lookup")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "1,x"], "must be comma-separated ids such as 464,3290; got '1,x'"),
        (
            ["--prompt", "hi", "--prompt-lookup", "2", "--draft", "x"],
            "give --prompt-lookup or --draft, not both",
        ),
        (["--prompt", "hi", "--prompt-lookup", "0"], "--prompt-lookup: must be a positive integer, got 0"),
        (["--prompt", "hi", "--prompt-lookup", "2", "--num-beams", "2"], "takes neither num_beams > 1"),
        (["--prompt", "hi", "--draft", "/no/such/dir"], "/no/such/dir"),
        (["--tokens", "1,320"], r"input_ids\[0, 1\] = 320 is outside the vocabulary \(0..319\)"),
        (["--tokens", "1", "--max-new-tokens", "48"], r"1 prompt tokens \+ 48 new tokens = 49 positions"),
        (["--prompt", "hi", "--top-p", "2"], r"top_p must be a number in \(0, 1\]"),
        (["--prompt", ""], r"--prompt: the prompt is empty; GPT-2 needs at least one token"),
        (["--tokens", "99999999999999999999999"], r"99999999999999999999999 is not a token id"),
        ([], "one of the arguments --prompt --tokens --prompt-file is required"),
        (["--prompt", "hi", "--num-return-sequences", "2"], "num_return_sequences=2 of greedy decoding"),
        (["--prompt", "hi", "--min-p", "2"], r"min_p must be a number in \[0, 1\] or None, got 2.0"),
        (["--prompt", "hi", "--logit-bias", "5"], r"must be ID=VALUE such as 50256=-100; got '5'"),
        (["--prompt", "hi", "--early-stopping", "soon"], "must be true, false or never; got 'soon'"),
        (["--prompt", "hi", "--seed", "-1"], "seed must be an integer of 0 or more, or None, got -1"),
        (
            ["--prompt", "hi", "--temperature", "0", "--top-k", "3"],
            r"--temperature 0 is greedy decoding: .*--top-k",
        ),
        (["--prompt", "hi", "--num-beams", "2", "--seed", "1"], "--num-beams searches .*: leave out --seed"),
        (["--prompt", "hi", "--draft-tokens", "3"], "--draft-tokens sizes the drafts of --draft CHECKPOINT"),
        (["--prompt-file", "/no/such/file"], r"--prompt-file /no/such/file: \[Errno 2\]"),
        (["--prompt", "hi", "--weight-format", "q2_k"], r"--weight-format: invalid choice: 'q2_k' \(choose"),
        (
            ["--prompt", "hi", "--weight-format", "q8_0", "--dtype", "bfloat16"],
            r"weight_format='q8_0' is for decoding on the CPU in float32, not on cpu in bfloat16",
        ),
    ],
)
def test_generate_refuses_bad_input_before_compiling(lm_checkpoint, args, message):
    done = run_cli("generate", "--checkpoint", str(lm_checkpoint(LM)), *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "compiling" not in done.stderr
    assert re.search(message, done.stderr), done.stderr
