"""GPT2Config: defaults, validation, and reading config.json."""

from __future__ import annotations

import json

import pytest

from max_gpt2 import GPT2Config


def test_defaults_are_gpt2_small():
    config = GPT2Config()
    assert (config.n_embd, config.n_head, config.n_layer) == (768, 12, 12)
    assert (config.n_positions, config.vocab_size, config.layer_norm_epsilon) == (1024, 50257, 1e-5)
    assert config.head_dim == 64


@pytest.mark.parametrize(
    ("n_embd", "n_head", "head_dim"), [(1024, 16, 64), (1600, 25, 64), (60, 5, 12), (7, 1, 7)]
)
def test_head_dim(n_embd, n_head, head_dim):
    assert GPT2Config(n_embd=n_embd, n_head=n_head).head_dim == head_dim


def test_indivisible_width_names_both_numbers():
    with pytest.raises(ValueError, match=r"n_embd \(768\) must be divisible by n_head \(10\)"):
        GPT2Config(n_head=10)


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_embd", 0), ("n_head", -1), ("n_layer", 2.0), ("vocab_size", True), ("n_positions", "1024")],
)
def test_fields_must_be_positive_integers(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a positive integer"):
        GPT2Config(**{field: value})


def test_epsilon_must_not_be_negative():
    with pytest.raises(ValueError, match="layer_norm_epsilon must be a non-negative number"):
        GPT2Config(layer_norm_epsilon=-1e-5)
    assert GPT2Config(layer_norm_epsilon=0.0).layer_norm_epsilon == 0.0  # Hugging Face runs it too


def write_config(directory, values) -> None:
    (directory / "config.json").write_text(json.dumps(values))


def test_reads_hugging_face_config(tmp_path):
    # The shape of the Hub's gpt2-medium config.json, with keys this project ignores.
    write_config(
        tmp_path,
        {
            "activation_function": "gelu_new",
            "architectures": ["GPT2LMHeadModel"],
            "bos_token_id": 50256,
            "eos_token_id": 50256,
            "n_inner": None,
            "model_type": "gpt2",
            "n_ctx": 1024,
            "n_embd": 1024,
            "n_head": 16,
            "n_layer": 24,
            "n_positions": 1024,
            "vocab_size": 50257,
            "layer_norm_epsilon": 1e-05,
        },
    )
    expected = GPT2Config(n_embd=1024, n_head=16, n_layer=24, eos_token_id=50256)
    assert expected.mlp_width == 4096 and expected.tie_word_embeddings
    for path in (
        tmp_path,
        tmp_path / "config.json",
        tmp_path / "model.safetensors",
        tmp_path / "model.safetensors.index.json",
    ):
        if path.suffix in (".safetensors", ".json") and path.name != "config.json":
            path.write_bytes(b"")  # only its location matters here
        assert GPT2Config.from_pretrained(path) == expected


def test_generic_aliases_and_missing_fields(tmp_path):
    write_config(tmp_path, {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2})
    assert GPT2Config.from_pretrained(tmp_path) == GPT2Config(n_embd=64, n_head=4, n_layer=2)


def test_round_trip_through_json(tmp_path):
    config = GPT2Config(
        n_embd=60,
        n_head=5,
        n_layer=3,
        n_positions=7,
        vocab_size=11,
        layer_norm_epsilon=1e-6,
        n_inner=50,
        activation_function="gelu",
        tie_word_embeddings=False,
        eos_token_id=10,
    )
    write_config(tmp_path, config.to_dict())
    assert GPT2Config.from_pretrained(tmp_path) == config


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model_type": "llama"}, "model_type is 'llama', expected 'gpt2'"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True is not supported"),
        ({"scale_attn_weights": False}, "scale_attn_weights=False is not supported"),
        ({"n_embd": 100, "n_head": 3}, r"config.json: n_embd \(100\) must be divisible by n_head \(3\)"),
        ({"n_embd": "768"}, "config.json: n_embd must be a positive integer, got '768'"),
        ({"n_inner": 0}, "n_inner must be a positive integer, got 0"),
        (
            {"activation_function": "mish"},
            r"activation_function 'mish' is not supported \(supported: gelu_new",
        ),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false, got 'yes'"),
        ({"eos_token_id": -1}, r"eos_token_id must be a token id, a list of them, or null; got -1"),
        ({"eos_token_id": [50256, "x"]}, r"eos_token_id must be a token id, .* got \(50256, 'x'\)"),
    ],
)
def test_config_json_that_this_attention_cannot_honour(tmp_path, values, message):
    write_config(tmp_path, values)
    with pytest.raises(ValueError, match=message):
        GPT2Config.from_pretrained(tmp_path)


def test_malformed_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        GPT2Config.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config\.json must hold a JSON object, not list"):
        GPT2Config.from_pretrained(tmp_path)


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no config.json in {tmp_path}"):
        GPT2Config.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        GPT2Config.from_pretrained(tmp_path / "absent" / "model.safetensors")


def test_what_hugging_face_loads_loads_here_too(tmp_path):
    """Its GPT2Config(vocab_size=300) writes its default eos_token_id, 50256, and runs with it."""
    write_config(tmp_path, {"vocab_size": 300, "eos_token_id": 50256, "bos_token_id": 50256})
    with pytest.warns(UserWarning, match=r"eos_token_id \[50256\] is not below vocab_size \(300\)"):
        config = GPT2Config.from_pretrained(tmp_path)
    assert config.eos_token_id == 50256 and config.stop_token_ids == ()
    write_config(
        tmp_path, {"vocab_size": 300, "eos_token_id": [7, 299, 50256], "reorder_and_upcast_attn": True}
    )
    with pytest.warns(UserWarning, match=r"eos_token_id \[50256\]"):
        config = GPT2Config.from_pretrained(tmp_path)
    assert config.eos_token_id == (7, 299, 50256) and config.stop_token_ids == (7, 299)
    assert GPT2Config.from_pretrained(tmp_path) == config  # a list reads back as the same config
    write_config(tmp_path, {"activation_function": "relu", "layer_norm_epsilon": 0})
    assert GPT2Config.from_pretrained(tmp_path).activation_function == "relu"
