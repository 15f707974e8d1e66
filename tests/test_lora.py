"""LoRA adapters merged as the weights load (`max_gpt2.model.checkpoints.lora`), in PEFT's saved form.

The reference is a checkpoint the test merges itself, in Hugging Face's Conv1D layout (`W + scale *
alpha / r * (B @ A).T`, PEFT's `merge_and_unload` for GPT-2's `fan_in_fan_out` projections), written
to disk and run by the float64 reference; the loaded model must give its logits. A scale of 0 gives
the checkpoint's own logits (so the weights cache keys the scale), a packed format the very logits of
the merged checkpoint packed, and what cannot merge is refused, naming the file and what is wrong.
PEFT's own `PeftModel` gives the same logits (`tests/test_peers.py`). The server merges them too
and lists them in llama-server's `/lora-adapters`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from max_gpt2 import CheckpointError, GPT2Config, cli, load_lm, reference
from max_gpt2.bench.server import ServerProcess, free_port
from max_gpt2.cli.console import adapters
from max_gpt2.cli.serve_options import add_arguments
from max_gpt2.model.checkpoints.checkpoint import Checkpoint, open_checkpoint
from max_gpt2.model.checkpoints.gguf_checkpoint import gguf_name
from max_gpt2.model.checkpoints.lora import LoRA, with_adapters
from max_gpt2.model.parameters import model_parameter_shapes
from max_gpt2.serving.api.llama_fields import check_lora
from max_gpt2.serving.api.protocol import Refusal
from max_gpt2.serving.settings import ServingSettings
from tests.gguf_files import write_gguf_file
from tests.support import LM, LM_ONE_LAYER, prompts

# Each adapted projection of layer 0: its rank (PEFT's rank_pattern gives c_fc its own).
RANKS = {"attn.c_attn": 4, "attn.c_proj": 4, "mlp.c_fc": 2, "mlp.c_proj": 4}
ALPHA, C_PROJ_ALPHA = 8.0, 3.0  # lora_alpha, and alpha_pattern's for mlp.c_proj


def write_adapter(directory: Path, config: GPT2Config, seed: int = 1, **settings: object) -> Path:
    """A PEFT adapter for layer 0 of a model of `config`, with random A and B (PEFT starts B at 0; a
    trained one is not), as `save_pretrained` writes it; `settings` change its config."""
    rng = np.random.default_rng(seed)
    shapes = model_parameter_shapes(config)
    tensors = {}
    for module, rank in RANKS.items():
        out, width = shapes[f"transformer.h.0.{module}.weight"]
        key = f"base_model.model.transformer.h.0.{module}"
        tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.3, (rank, width)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.3, (out, rank)).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    peft = {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": ALPHA,
        "rank_pattern": {"c_fc": 2},
        "alpha_pattern": {"mlp.c_proj": C_PROJ_ALPHA},
        "target_modules": ["c_attn", "c_proj", "c_fc"],
        "fan_in_fan_out": True,
        "bias": "none",
        "use_dora": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(peft | settings))
    return directory


def merged_by_hand(checkpoint: Path, adapter: Path, scale: float, directory: Path) -> Path:
    """`checkpoint` with `adapter` merged as PEFT merges it, written as a checkpoint of its own."""
    stored = load_file(str(checkpoint / "model.safetensors"))
    pairs = load_file(str(adapter / "adapter_model.safetensors"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    for module, rank in RANKS.items():
        a = pairs[f"base_model.model.transformer.h.0.{module}.lora_A.weight"].astype(np.float64)
        b = pairs[f"base_model.model.transformer.h.0.{module}.lora_B.weight"].astype(np.float64)
        alpha = C_PROJ_ALPHA if module == "mlp.c_proj" else ALPHA
        factor = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        stored[f"h.0.{module}.weight"] = (stored[f"h.0.{module}.weight"] + scale * factor * (b @ a).T).astype(
            np.float32
        )
    directory.mkdir()
    save_file(stored, str(directory / "model.safetensors"))
    (directory / "config.json").write_text((checkpoint / "config.json").read_text())
    return directory


@pytest.mark.parametrize("scale, rslora", [(0.5, False), (1.0, True)])
def test_merged_adapter_gives_the_reference_logits_of_the_weights_merged_by_hand(
    lm_checkpoint, tmp_path, scale, rslora
):
    base = lm_checkpoint(LM_ONE_LAYER)
    adapter = write_adapter(tmp_path / "adapter", LM_ONE_LAYER, use_rslora=rslora)
    lm = load_lm(with_adapters(open_checkpoint(base), [LoRA(adapter, scale)]), cache_dir=tmp_path / "cache")
    ids = prompts(LM_ONE_LAYER, 2, 9)
    got = lm.prefill(ids, lm.new_cache(2, 9), all_logits=True)
    weights = Checkpoint(merged_by_hand(base, adapter, scale, tmp_path / "merged")).model_weights()
    expected, _ = reference.lm_logits_and_largest_score(ids, weights, LM_ONE_LAYER)
    own, _ = reference.lm_logits_and_largest_score(ids, Checkpoint(base).model_weights(), LM_ONE_LAYER)
    assert np.abs(expected - own).max() > 0.1  # the adapter moves the logits
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)


def test_a_scale_of_zero_is_the_checkpoint_and_a_packed_format_packs_the_merged_weights(
    lm_checkpoint, tmp_path
):
    base = lm_checkpoint(LM_ONE_LAYER)
    adapter = write_adapter(tmp_path / "adapter", LM_ONE_LAYER)
    cache, ids = tmp_path / "cache", prompts(LM_ONE_LAYER, 1, 7)

    def logits(checkpoint, **options):
        lm = load_lm(checkpoint, cache_dir=cache, **options)
        return lm.prefill(ids, lm.new_cache(1, 7), all_logits=True)

    merged = logits(with_adapters(open_checkpoint(base), [LoRA(adapter, 0.5)]))
    unmoved = logits(with_adapters(open_checkpoint(base), [LoRA(adapter, 0.0)]))  # the same cache
    np.testing.assert_array_equal(unmoved, logits(base))
    assert np.abs(merged - unmoved).max() > 0.1
    by_hand = merged_by_hand(base, adapter, 0.5, tmp_path / "merged")
    np.testing.assert_array_equal(
        logits(
            with_adapters(open_checkpoint(base), [LoRA(adapter, 0.5)]),
            weight_format="q8_0",
            kv_cache="float32",
        ),
        logits(by_hand, weight_format="q8_0", kv_cache="float32"),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"config": {"use_dora": True}}, "use_dora is True"),
        ({"config": {"peft_type": "IA3"}}, "peft_type is 'IA3'"),
        ({"config": {"modules_to_save": ["lm_head"]}}, "modules_to_save"),
        ({"key": "base_model.model.transformer.wte.lora_embedding_A"}, "no LoRA pair of a projection"),
        ({"key": "base_model.model.transformer.h.3.attn.c_attn.lora_A.weight"}, "past the model's layers"),
        ({"drop": "base_model.model.transformer.h.0.mlp.c_fc.lora_B.weight"}, "lora_A but not its partner"),
        ({"shape": "base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight"}, "must be [r, 32] and [96, r]"),
    ],
)
def test_an_adapter_that_cannot_merge_is_refused_naming_what(lm_checkpoint, tmp_path, change, message):
    base = lm_checkpoint(LM_ONE_LAYER)
    adapter = write_adapter(tmp_path / "adapter", LM_ONE_LAYER, **change.get("config", {}))
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    if "key" in change:
        tensors[change["key"]] = np.zeros((4, 32), np.float32)
    tensors.pop(change.get("drop", ""), None)
    if "shape" in change:
        tensors[change["shape"]] = np.zeros((2, 31), np.float32)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        with_adapters(open_checkpoint(base), [LoRA(adapter)])
    quantized = write_gguf_file(base, LM_ONE_LAYER, tmp_path / "q8.gguf", "Q8_0")
    with pytest.raises(CheckpointError, match=r"q8\.gguf is q8_0: a LoRA merges into float weights"):
        with_adapters(open_checkpoint(quantized), [LoRA(adapter)])
    with pytest.raises(FileNotFoundError, match=re.escape("no adapter_config.json")):
        with_adapters(open_checkpoint(base), [LoRA(tmp_path)])


def test_the_server_serves_the_merged_weights_and_lists_them_as_llama_server_does(
    lm_checkpoint, compiled_lm, tmp_path
):
    """`max-gpt2 serve --lora-scaled DIR:0.5`: greedy tokens of the weights merged by hand; llama-server's
    `/lora-adapters`, its scales fixed; the settings carry the adapters to the worker."""
    from tests.test_serve import client

    base = lm_checkpoint(LM)
    adapter = write_adapter(tmp_path / "adapter", LM)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--lora-scaled", f"{adapter}:0.5"])
    assert adapters(args) == [LoRA(adapter, 0.5)]
    settings = ServingSettings(lora=((str(adapter), 0.5),))
    assert ServingSettings.from_json(settings.to_json()).adapters() == [LoRA(adapter, 0.5)]
    check_lora([{"id": 0, "scale": 0.5}], (0.5,))
    for wrong in ([], [{"id": 1, "scale": 0.5}], [{"id": 0}], {"id": 0, "scale": 0.5}):  # [] is scale 0
        with pytest.raises(Refusal, match="lora"):
            check_lora(wrong, (0.5,))
    server = ServerProcess(base, tmp_path / "server.log", free_port(), "--device", "cpu", *args_of(adapter))
    try:
        server.wait_until_ready(timeout=900)
        lm = compiled_lm(LM).with_weights(
            Checkpoint(merged_by_hand(base, adapter, 0.5, tmp_path / "merged")).model_weights()
        )
        prompt = [5, 17, 42, 8]
        expected = lm.generate(np.array([prompt]), 6)[0, len(prompt) :].tolist()
        answer = client(server).completions.create(
            model="gpt2",
            prompt=prompt,
            max_tokens=6,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        assert answer.choices[0].model_extra["token_ids"] == expected
        listed = httpx.get(f"{server.url}/lora-adapters").json()
        assert listed == [
            {"id": 0, "path": str(adapter.resolve()), "scale": 0.5, "task_name": "", "prompt_prefix": ""}
        ]
        same = httpx.post(f"{server.url}/lora-adapters", json=[{"id": 0, "scale": 0.5}])
        assert same.status_code == 200 and same.json() == {"success": True}
        other = httpx.post(f"{server.url}/lora-adapters", json=[{"id": 0, "scale": 1.0}])
        assert other.status_code == 400 and other.json()["error"]["param"] == "lora"
        assert "--lora-scaled" in other.json()["error"]["message"]
        # A request's `lora` (llama-server's, on every route) may ask for the scales merged, not others.
        body = {"prompt": prompt, "n_predict": 2, "temperature": 0, "ignore_eos": True, "return_tokens": True}
        same = httpx.post(f"{server.url}/completion", json=body | {"lora": [{"id": 0, "scale": 0.5}]})
        assert same.status_code == 200 and same.json()["tokens"] == expected[:2]
        openai = {"model": "gpt2", "prompt": prompt, "max_tokens": 2}
        for route, asked in (("/completion", body), ("/v1/completions", openai)):
            other = httpx.post(f"{server.url}{route}", json=asked | {"lora": [{"id": 0, "scale": 2}]})
            assert other.status_code == 400 and other.json()["error"]["param"] == "lora"
            assert "merged into the weights at scales [0.5]" in other.json()["error"]["message"]
    finally:
        server.stop()


def args_of(adapter: Path) -> tuple[str, ...]:
    return ("--lora-scaled", f"{adapter}:0.5")


def write_gguf_adapter(path: Path, peft_directory: Path, alpha: float) -> Path:
    """`peft_directory`'s pairs as a GGUF adapter llama.cpp loads (`gguf`'s writer, llama.cpp's own
    Python package): `blk.0.attn_qkv.weight.lora_a` `[r, in]`, `.lora_b` `[out, r]`, one alpha."""
    pairs = load_file(str(peft_directory / "adapter_model.safetensors"))
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for module in RANKS:
        key, name = (
            f"base_model.model.transformer.h.0.{module}",
            gguf_name(f"transformer.h.0.{module}.weight"),
        )
        writer.add_tensor(f"{name}.lora_a", pairs[f"{key}.lora_A.weight"])
        writer.add_tensor(f"{name}.lora_b", pairs[f"{key}.lora_B.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_adapter_merges_as_the_same_pairs_from_peft(lm_checkpoint, tmp_path):
    """llama.cpp's GGUF adapter (alpha over each pair's rank, times the scale) adds the very updates of
    the PEFT adapter it holds the pairs of; one that is not a GPT-2 LoRA is refused."""
    base = open_checkpoint(lm_checkpoint(LM))
    peft = write_adapter(tmp_path / "peft", LM, alpha_pattern={})
    file = write_gguf_adapter(tmp_path / "adapter.gguf", peft, ALPHA)
    from_peft = with_adapters(base, [LoRA(peft, 0.5)])
    from_gguf = with_adapters(base, [LoRA(file, 0.5)])
    assert from_gguf.files[-1] == file
    for module in RANKS:
        name = f"transformer.h.0.{module}.weight"
        np.testing.assert_array_equal(from_gguf.tensor(name).data, from_peft.tensor(name).data)
    no_alpha = write_gguf_adapter(tmp_path / "no-alpha.gguf", peft, 0.0)  # llama.cpp: B @ A, scaled alone
    delta = with_adapters(base, [LoRA(no_alpha, 0.5)]).deltas[0]["transformer.h.0.mlp.c_fc.weight"]
    assert delta.factor == 0.5
    model = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "gpt2")  # a file with no general.type
    model.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    model.write_header_to_file(), model.write_kv_data_to_file(), model.write_tensors_to_file(), model.close()
    with pytest.raises(CheckpointError, match=r"general\.type is None; a GPT-2 LoRA has 'adapter'"):
        with_adapters(base, [LoRA(tmp_path / "model.gguf")])


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_a_gguf_adapter_gives_llama_servers_greedy_tokens(lm_checkpoint, compiled_lm, tmp_path, scale):
    """llama-server (`LLAMA_CPP`) with `--lora-scaled FILE:S` on the same weights as a GGUF file: the
    same greedy tokens as ours with the adapter merged."""
    from max_gpt2.bench.server import stop_group
    from tests.llama_cpp import llama_server_on

    base = lm_checkpoint(LM)
    file = write_gguf_adapter(tmp_path / "adapter.gguf", write_adapter(tmp_path / "peft", LM), ALPHA)
    process, url = llama_server_on(base, tmp_path, "--lora-scaled", f"{file}:{scale}", "--no-warmup")
    try:
        prompt = [5, 17, 42, 8]
        body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True, "return_tokens": True}
        theirs = httpx.post(f"{url}/completion", json=body, timeout=60).json()["tokens"]
    finally:
        stop_group(process.pid, process.wait)
    merged = with_adapters(open_checkpoint(base), [LoRA(file, scale)])
    lm = compiled_lm(LM).with_weights({name: merged.tensor(name).data for name in model_parameter_shapes(LM)})
    assert theirs == lm.generate(np.array([prompt]), 8)[0, len(prompt) :].tolist()


def test_convert_writes_the_merged_weights_and_reads_llama_servers_syntax(lm_checkpoint, tmp_path):
    """`max-gpt2 convert --lora-scaled DIR:0.5` writes the merged weights as a GGUF file; `--lora` takes
    comma-separated paths and `--lora-scaled` PATH:SCALE pairs, as llama-server does."""
    base, out = lm_checkpoint(LM), tmp_path / "merged.gguf"
    adapter, other = write_adapter(tmp_path / "a", LM), write_adapter(tmp_path / "b", LM, seed=2)
    with contextlib.redirect_stderr(io.StringIO()):  # its progress lines
        assert (
            cli.main(
                ["convert", "--checkpoint", str(base), "--lora-scaled", f"{adapter}:0.5", "--out", str(out)]
            )
            == 0
        )
    merged, written = with_adapters(open_checkpoint(base), [LoRA(adapter, 0.5)]), open_checkpoint(out)
    for name in model_parameter_shapes(LM):
        np.testing.assert_array_equal(written.tensor(name).data, merged.tensor(name).data)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--lora", f"{adapter},{other}", "--lora-scaled", f"{other}:-1,{adapter}:2"])
    assert adapters(args) == [LoRA(adapter), LoRA(other), LoRA(other, -1.0), LoRA(adapter, 2.0)]
    with pytest.raises(ValueError, match=re.escape(f"--lora-scaled {adapter}: PATH:SCALE")):
        adapters(parser.parse_args(["--lora-scaled", str(adapter)]))
