"""`max-gpt2 serve --weight-format`: the projections and the LM head served packed, against `CompiledLM`
in the same format.

A second server (started at collection, `conftest.SERVED`) serves LM's checkpoint, as an F32 GGUF file
with the tokenizer it carries, with its weights in q4_0; `lm.generate` and `lm.logprobs` on
`CompiledLM` with the same format and a float32 KV cache (the paged cache's dtype) are what it must
answer, token for token and log-probability for log-probability. How the format reaches the server
(`ServingSettings`, in `MAX_GPT2_SERVING`) and a GGUF file's model directory are checked without one.
"""

from __future__ import annotations

import argparse
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import open_checkpoint
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.formats import FLOAT32
from max_gpt2.outputs import Progress
from max_gpt2.serving.settings import DECODE_STEPS, VARIABLE, ServingSettings
from max_gpt2.testing import END_OF_TEXT
from tests.support import LM, requires_serving
from tests.test_serve import NEW_TOKENS, PROMPTS, complete, served

pytestmark = requires_serving()


def handed(env: dict[str, str]) -> ServingSettings:
    """The settings `max-gpt2 serve` hands MAX's processes in `env`."""
    return ServingSettings.from_json(env[VARIABLE])


def hand(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
    """This process's environment as a served process's, with these settings."""
    monkeypatch.setenv(VARIABLE, ServingSettings(**settings).to_json())


def served_weights(server) -> dict[str, np.ndarray]:
    """The served GGUF file's float32 parameters, as they lie in it."""
    return dict(bound_weights(open_checkpoint(server.checkpoint), FLOAT32))


@pytest.fixture(scope="module")
def q4_0_lm(compiled_lm, served_q4_0_lm):
    """`CompiledLM` with the served checkpoint's weights in q4_0, its KV cache float32 as the server's."""
    return compiled_lm(LM, weights="q4_0", kv_cache="float32").with_weights(served_weights(served_q4_0_lm))


def greedy_ids(lm, prompt_ids: list[int], eos: int) -> list[int]:
    """`lm.generate`'s new ids after `prompt_ids`, up to and with end-of-text, as MAX lists them."""
    new = lm.generate(np.array([prompt_ids]), NEW_TOKENS, eos_token_id=eos)[0, len(prompt_ids) :].tolist()
    return new[: new.index(eos) + 1] if eos in new else new


def test_packed_weights_are_served_as_our_model_generates_with_them(served_q4_0_lm, q4_0_lm, compiled_lm):
    """Concurrent requests of different lengths (ragged prompt steps, then shared decoding steps) each
    get the ids `lm.generate` gives in the same format, which are not all float32's."""
    tokenizer = load_tokenizer(served_q4_0_lm.checkpoint)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    prompts = [tokenizer.encode(prompt).ids for prompt in PROMPTS]
    expected = [greedy_ids(q4_0_lm, prompt_ids, eos) for prompt_ids in prompts]
    assert sum(map(len, expected)) > 2 * len(PROMPTS)  # not vacuous
    float32_lm = compiled_lm(LM).with_weights(served_weights(served_q4_0_lm))
    assert expected != [greedy_ids(float32_lm, prompt_ids, eos) for prompt_ids in prompts]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        choices = list(pool.map(lambda prompt: complete(served_q4_0_lm, prompt).choices[0], PROMPTS))
    assert [served(choice).ids for choice in choices] == expected


def test_packed_weights_give_our_models_log_probabilities(served_q4_0_lm, q4_0_lm):
    """The new tokens', and with echo the prompt's (the graph that returns every token's logits)."""
    tokenizer = load_tokenizer(served_q4_0_lm.checkpoint)
    prompt_ids = tokenizer.encode(PROMPTS[0]).ids
    choice = complete(served_q4_0_lm, PROMPTS[0], logprobs=2).choices[0]
    new = served(choice).ids
    ours = q4_0_lm.logprobs(np.array([prompt_ids + new]))[0]
    generated = range(len(prompt_ids), len(prompt_ids) + len(new))
    # The server's paged attention and ours sum a step's keys in another order (float32's 1e-6, as the
    # float32 server shows); q4_0 rounds each product's x to int8 blocks, which can make that one
    # rounding step of one value: 1.5e-3 seen at one position (AMD EPYC, AVX2). Tokens stay equal.
    np.testing.assert_allclose(choice.logprobs.token_logprobs[: len(new)], ours[generated], atol=5e-3)
    echoed = complete(served_q4_0_lm, PROMPTS[0], echo=True, logprobs=1, max_tokens=1).choices[0]
    np.testing.assert_allclose(
        echoed.logprobs.token_logprobs[1 : len(prompt_ids) + 1], ours[1 : len(prompt_ids) + 1], atol=1e-4
    )


def serve_arguments(
    checkpoint, weight_format: str, decode_steps: int | None = None, prompt_lookup: int | None = None
) -> argparse.Namespace:
    """`max-gpt2 serve`'s options, as its parser reads them."""
    from max_gpt2.cli import build_parser

    steps = [] if decode_steps is None else ["--decode-steps", str(decode_steps)]
    steps += [] if prompt_lookup is None else ["--prompt-lookup", str(prompt_lookup)]
    options = ["--checkpoint", str(checkpoint), "--device", "cpu", "--weight-format", weight_format, *steps]
    return build_parser().parse_args(["serve", *options])


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "q8_0", "q4_0"])
def test_serve_hands_its_weights_format_to_the_server_and_only_that(weights, lm_checkpoint, monkeypatch):
    """Settings left in the environment are not served: `--weight-format` (float32 by default) decides."""
    from max_gpt2.cli.serve import serve_command

    hand(monkeypatch, weight_format="q8_0" if weights != "q8_0" else "q4_0", decode_steps=7, prompt_lookup=5)
    _, env = serve_command(serve_arguments(lm_checkpoint(LM), weights), Progress(io.StringIO()))
    assert handed(env) == ServingSettings(weight_format=weights)


@pytest.mark.parametrize(("decode_steps", "prompt_lookup"), [(None, None), (1, 8), (3, 1)])
def test_serve_hands_its_decode_steps_and_prompt_lookup_to_the_server(
    decode_steps, prompt_lookup, lm_checkpoint, monkeypatch
):
    """`--decode-steps` (the server's default when not given) and `--prompt-lookup` (none) reach the
    worker's pipeline and cache settings as given."""
    from max_gpt2.cli.serve import serve_command

    arguments = serve_arguments(lm_checkpoint(LM), "float32", decode_steps, prompt_lookup)
    _, env = serve_command(arguments, Progress(io.StringIO()))
    monkeypatch.setenv(VARIABLE, env[VARIABLE])
    settings = ServingSettings.from_environment()
    assert (settings.decode_steps, settings.prompt_lookup) == (
        decode_steps or DECODE_STEPS,
        prompt_lookup or 0,
    )


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ('{"decode_steps": 0}', "decode_steps: steps a scheduler step may decode, 1 or more"),
        ('{"prompt_lookup": -2}', "prompt_lookup: tokens a request may draft, 0 (none) or more"),
        ('{"served_names": []}', "served_names: one or more non-empty names"),
        ('{"decode_step": 3}', "unknown settings ['decode_step']"),
        ("four", "Expecting value"),
    ],
)
def test_the_server_refuses_settings_it_cannot_run_naming_them(setting, says, monkeypatch):
    monkeypatch.setenv(VARIABLE, setting)
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*{re.escape(says)}"):
        ServingSettings.from_environment()


def test_the_server_refuses_a_format_it_does_not_know(monkeypatch, lm_checkpoint):
    from max_gpt2.model.checkpoints.checkpoint import open_checkpoint
    from max_gpt2.serving.model_config import served_weight_format

    def checkpoint():
        return open_checkpoint(lm_checkpoint(LM))

    hand(monkeypatch, weight_format="q2_k")
    message = (
        "MAX_GPT2_SERVING's weight_format must be one of float32, bfloat16, q8_0, q4_0, q4_1, q5_0, q5_1, "
        "q4_k, q5_k, q6_k; got 'q2_k'"
    )
    with pytest.raises(ValueError, match=message):
        served_weight_format(checkpoint)
    monkeypatch.delenv(VARIABLE)
    assert served_weight_format(checkpoint).name == "float32"


def test_serve_hands_a_files_mix_of_formats_to_the_server(tmp_path, lm_checkpoint, monkeypatch):
    """A Q4_K_M file serves as it loads: the mix's name in the environment, and the server takes the
    file's own mix (each tensor in its type) for it, not a format of that name of its own."""
    import shutil

    from max_gpt2.cli.serve import serve_command
    from max_gpt2.model.checkpoints.checkpoint import open_checkpoint
    from max_gpt2.serving.model_config import served_weight_format
    from tests.gguf_files import write_typed_file
    from tests.test_gguf_types import PRESETS, WIDE

    path = tmp_path / "q4_k_m.gguf"
    write_typed_file(path, WIDE, PRESETS["Q4_K_M"], np.random.default_rng(0))
    shutil.copy(lm_checkpoint(LM) / "tokenizer.json", tmp_path)  # a tokenizer beside the file
    options = ["serve", "--checkpoint", str(path), "--device", "cpu"]
    from max_gpt2.cli import build_parser

    _, env = serve_command(build_parser().parse_args(options), Progress(io.StringIO()))
    assert handed(env).weight_format == "q4_k+q6_k"
    monkeypatch.setenv(VARIABLE, env[VARIABLE])
    served = served_weight_format(lambda: open_checkpoint(path))
    assert served == open_checkpoint(path).weight_format  # opened again: the same mix
    assert served.format_for("transformer.h.1.mlp.c_proj.weight").name == "q6_k"
    with pytest.raises(ValueError, match="got 'q4_k\\+q6_k'"):  # not this checkpoint's
        served_weight_format(lambda: open_checkpoint(lm_checkpoint(LM)))


def test_serve_makes_a_model_directory_for_a_gguf_file(tmp_path, monkeypatch):
    """A GGUF file is served in its own format from a directory made in the cache: `config.json` naming
    our architecture with the file's shapes, the file's tokenizer, and the file itself as MAX's weights."""
    from max_gpt2 import GPT2Config, cli
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.testing import write_checkpoint

    monkeypatch.setenv("MAX_GPT2_CACHE", str(tmp_path / "cache"))
    config = GPT2Config(n_embd=64, n_head=2, n_layer=1, n_positions=16, vocab_size=300)
    checkpoint = write_checkpoint(tmp_path / "small", config, tokenizer=True)
    gguf_file = tmp_path / "small-q8_0.gguf"
    convert = ["convert", "--checkpoint", str(checkpoint), "--weight-format", "q8_0", "--out", str(gguf_file)]
    assert cli.main(convert) == 0
    arguments = cli.build_parser().parse_args(["serve", "--checkpoint", str(gguf_file), "--device", "cpu"])
    command, env = serve_command(arguments, Progress(io.StringIO()))
    assert handed(env).weight_format == "q8_0"
    options = dict(argument.removeprefix("--").split("=", 1) for argument in command if "=" in argument)
    model = Path(options["model-path"])
    assert model.is_relative_to(tmp_path / "cache" / "served")
    assert (
        Path(options["weight-path"]) == model / "model.gguf" and (model / "model.gguf").resolve() == gguf_file
    )
    assert json.loads((model / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    assert GPT2Config.from_pretrained(model) == config  # tied: the head is token_embd, as written
    text = "The cat sat on the mat."
    assert load_tokenizer(model).encode(text).ids == load_tokenizer(checkpoint).encode(text).ids
    # A file with a chat template (llama.cpp's key) has it served as the model's own.
    from max_gpt2.cli.serve_gguf import CHAT_TEMPLATE, model_directory

    assert not (model / "tokenizer_config.json").exists()
    file = open_checkpoint(gguf_file)
    metadata = {**file.tokenizer_metadata, CHAT_TEMPLATE: "{{ messages[0]['content'] }}"}
    monkeypatch.setattr(type(file), "tokenizer_metadata", property(lambda self: metadata))
    again = model_directory(file, load_tokenizer(gguf_file), "GPT2LMHeadModel", tmp_path / "cache")
    assert again == model
    assert json.loads((model / "tokenizer_config.json").read_text()) == {
        "chat_template": metadata[CHAT_TEMPLATE]
    }
