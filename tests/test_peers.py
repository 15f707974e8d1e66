"""Against Hugging Face's own GPT-2 and PyTorch (skipped unless `torch` and `transformers` are installed).

Attention: Hugging Face loads a checkpoint written by `write_checkpoint` (so our
files are in its layout), runs the whole model, and a hook captures one layer's
attention input and output; our compiled attention must give the same output.
The whole model: Hugging Face makes and saves a GPT2LMHeadModel (both key
layouts, tied and untied heads); we load its files and must give the same logits
and the same 32 greedy tokens as its `generate`, on a left-padded batch.
Generation's controls (penalties, n-gram bans, min-p, a minimum length) and beam search must give
Hugging Face's `generate`'s tokens, token for token, on the checkpoint it saved.
The benchmarks' PyTorch and Hugging Face contenders and `benchmarks/breakdown.py` run here too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from max_gpt2 import Checkpoint, Sampler, cli, load_attention_weights, load_lm, reference
from max_gpt2.testing import write_checkpoint
from max_gpt2.verify import compare
from tests.support import GPT2_SMALL, LM, ODD, layout_id, run_python

torch = pytest.importorskip("torch", reason="peer check needs torch (pip install -e '.[peers]')")
transformers = pytest.importorskip(
    "transformers", reason="peer check needs transformers (pip install -e '.[peers]')"
)


def hugging_face_attention(
    path, layer: int, seq_len: int, implementation: str
) -> tuple[np.ndarray, np.ndarray]:
    """Runs Hugging Face's GPT2Model on random tokens; returns `layer`'s attention input and output."""
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2Model.from_pretrained(path, attn_implementation=implementation).eval()
    seen = {}

    def capture(module, args, kwargs, output):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).numpy().copy()
        seen["y"] = output[0].numpy().copy()

    model.h[layer].attn.register_forward_hook(capture, with_kwargs=True)
    tokens = np.random.default_rng(layer).integers(0, model.config.vocab_size, (2, seq_len))
    with torch.no_grad():
        model(torch.from_numpy(tokens))
    return seen["x"], seen["y"]


@pytest.mark.parametrize("config", [ODD, GPT2_SMALL], ids=layout_id)
@pytest.mark.parametrize("layout", ["hub", "save_pretrained"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_matches_hugging_face(tmp_path, compiled, config, layout, implementation):
    two_layers = dataclasses.replace(config, n_layer=2, vocab_size=101)
    path = write_checkpoint(tmp_path, two_layers, seed=8, layout=layout)
    x, hf_output = hugging_face_attention(path, layer=1, seq_len=33, implementation=implementation)
    weights = load_attention_weights(path, 1)
    ours = compiled(config).with_weights(weights)(x)
    expected, largest_score = reference.attention_and_largest_score(x, weights, config.n_head)
    assert compare(hf_output, expected, "float32", largest_score).passed
    assert compare(ours, hf_output.astype(np.float64), "float32", largest_score).passed


def test_bench_times_pytorch_beside_ours(tmp_path, capsys):
    argv = ["bench", "--device", "cpu", "--models", f"{ODD.n_embd}x{ODD.n_head}", "--shapes", "2x9"]
    argv += ["--impls", "graph,torch-eager,torch-sdpa", "--repeat", "2", "--no-cold-compile"]
    assert cli.main([*argv, "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench-cpu-float32.json").read_text())
    rows = {row["impl"]: row for row in report["results"]}
    assert set(rows) == {"graph", "torch-eager", "torch-sdpa"} and not report["skipped"]
    assert all(row["matches_reference"] for row in rows.values())
    assert rows["torch-sdpa"]["speedup_vs_sdpa"] == 1.0 and rows["torch-eager"]["speedup_vs_eager"] == 1.0
    assert rows["graph"]["speedup_vs_sdpa"] == pytest.approx(
        rows["torch-sdpa"]["seconds"] / rows["graph"]["seconds"]
    )
    assert report["machine"]["torch"] == torch.__version__
    assert "| torch-sdpa |" in capsys.readouterr().out


def test_breakdown_script_splits_projections_from_the_core():
    done = run_python(
        Path(__file__).parent.parent / "benchmarks" / "breakdown.py", "--shape", "1x16", "--repeat", "1"
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split("|") for line in done.stdout.splitlines() if line.startswith("| ") and "ms" not in line
    ]
    assert [row[1].strip() for row in rows] == ["graph", "flash", "torch-sdpa", "torch-eager"]
    for row in rows:
        total, projections, core = (float(cell) for cell in row[2:5])
        assert core == pytest.approx(total - projections, abs=0.011)


# The whole model against Hugging Face's GPT2LMHeadModel.


def hugging_face_lm(path: Path, head: str):
    """A seeded GPT2LMHeadModel with LM's shapes, saved by Hugging Face itself into `path`.

    `head`: "tied" saves the model (`transformer.h.0...` keys, no head stored);
    "hub-keys" saves only its `transformer`, a GPT2Model (the Hub's `h.0...` keys);
    "untied" unties the head; "stored" adds an `lm_head.weight` of its own to a
    tied model's file, and returns the model Hugging Face loads from it.
    """
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        **{key: value for key, value in LM.to_dict().items() if key != "model_type"},
        initializer_range=0.1,  # wider than GPT-2's 0.02, so that attention is far from uniform
        bos_token_id=None,
        pad_token_id=0,
    )
    config.tie_word_embeddings = head != "untied"
    model = transformers.GPT2LMHeadModel(config).eval()
    if head == "untied":
        with torch.no_grad():
            model.lm_head.weight.normal_(0, 0.1)
    (model.transformer if head == "hub-keys" else model).save_pretrained(path)
    if head != "stored":
        return model
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = np.random.default_rng(0).normal(0, 0.1, (LM.vocab_size, LM.n_embd))
    save_file(
        {k: v.astype(np.float32) for k, v in tensors.items()}, path / "model.safetensors", {"format": "pt"}
    )
    return transformers.GPT2LMHeadModel.from_pretrained(path).eval()


def test_a_peft_adapter_merges_as_peft_applies_it(tmp_path, compiled_lm):
    """A LoRA adapter in PEFT's saved form (rank and alpha patterns, rsLoRA) merged as the weights load
    (`max_gpt2.model.checkpoints.lora`) gives the logits of PEFT's `PeftModel` over Hugging Face's model."""
    peft = pytest.importorskip("peft", reason="peer check needs peft (pip install peft)")
    from max_gpt2.model.checkpoints.checkpoint import open_checkpoint
    from max_gpt2.model.checkpoints.lora import LoRA, with_adapters
    from tests.test_lora import write_adapter

    compiled_lm(LM)
    hf = hugging_face_lm(tmp_path / "base", "tied")
    adapter = write_adapter(tmp_path / "adapter", LM, use_rslora=True)
    ids = PADDED[1:]
    with torch.no_grad():
        own = hf(torch.from_numpy(ids)).logits.numpy()
        adapted = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()  # in place: hf is adapted too
        theirs = adapted(torch.from_numpy(ids)).logits.numpy().astype(np.float64)
    assert np.abs(theirs - own).max() > 0.1
    checkpoint = with_adapters(open_checkpoint(tmp_path / "base"), [LoRA(adapter)])
    ours = load_lm(checkpoint, device="cpu", cache_dir=tmp_path / "cache").logits(ids)
    comparison = compare(ours, theirs, "float32")
    assert comparison.passed, comparison


PADDED = np.array(
    [[0, 0, 0, 11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26, 27, 28], [0, 0, 0, 0, 0, 0, 31, 32]]
)
PADDED_MASK = (np.arange(8)[None, :] >= np.array([[3], [0], [6]])).astype(np.int64)


@pytest.mark.parametrize("head", ["tied", "hub-keys", "untied", "stored"])
def test_lm_matches_hugging_face(tmp_path, compiled_lm, head):
    compiled_lm(LM)  # LM's graph is then in MAX's cache
    hf = hugging_face_lm(tmp_path, head)
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert any(key.startswith("h.0.") for key in keys) == (head == "hub-keys")
    assert ("lm_head.weight" in keys) == (head in ("untied", "stored"))
    ours = load_lm(tmp_path, device="cpu")
    weights = Checkpoint(tmp_path).model_weights()

    # Hugging Face's forward numbers positions 0, 1, ... whatever the mask says unless it is given
    # position ids; its generate (and our model) count real tokens only.
    positions = torch.from_numpy(np.maximum(PADDED_MASK.cumsum(axis=1) - 1, 0))
    with torch.no_grad():
        hf_logits = hf(
            torch.from_numpy(PADDED), attention_mask=torch.from_numpy(PADDED_MASK), position_ids=positions
        ).logits.numpy()
    real = PADDED_MASK.astype(bool)
    expected, largest_score = reference.lm_logits_and_largest_score(PADDED, weights, LM, PADDED_MASK)
    assert compare(hf_logits[real], expected[real], "float32", largest_score).passed
    comparison = compare(
        ours.logits(PADDED, PADDED_MASK)[real], hf_logits[real].astype(np.float64), "float32"
    )
    assert comparison.passed, comparison

    with torch.no_grad():
        hf_tokens = hf.generate(
            torch.from_numpy(PADDED),
            attention_mask=torch.from_numpy(PADDED_MASK),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        ).numpy()
    assert hf_tokens.shape == (3, 40)
    np.testing.assert_array_equal(ours.generate(PADDED, 32, PADDED_MASK), hf_tokens)
    alone = ours.generate(PADDED[:1, 3:], 32)
    np.testing.assert_array_equal(alone[0], hf_tokens[0, 3:])


def test_bench_generate_times_hugging_face_on_the_same_tokens(lm_checkpoint, tmp_path):
    argv = ["bench-generate", "--device", "cpu", "--models", "", "--checkpoint", str(lm_checkpoint(LM))]
    argv += ["--cases", "1x4+6,2x3+9", "--prefill", "16", "--rounds", "1", "--output", str(tmp_path)]
    assert cli.main(argv) == 0  # it refuses to time contenders whose tokens differ from ours
    (model,) = json.loads((tmp_path / "bench-generate-cpu-float32.json").read_text())["models"].values()
    rates = {(row["case"], row["contender"]): row["tokens_per_second"] for row in model["cases"]}
    assert set(rates) == {(case, c) for case in ("1x4+6", "2x3+9") for c in ("max", "hf-eager", "hf-sdpa")}
    for row in model["cases"]:
        assert set(row["speedup"]) == {"max", "hf-eager", "hf-sdpa"} - {row["contender"]}
        for peer, ratio in row["speedup"].items():
            assert ratio == pytest.approx(row["tokens_per_second"] / rates[row["case"], peer])  # one round
    assert set(model["prefill"]) == {"tokens", "max", "hf-eager", "hf-sdpa"}
    assert set(model["curve"]) == {"max", "hf-eager", "hf-sdpa"}


# Scoring, and checkpoints as save_pretrained writes them from GPT2Config's defaults.


def test_logprobs_and_perplexity_match_hugging_faces_loss(tmp_path, compiled_lm):
    """Per-token log-probabilities against its logits, the mean against its `labels=` loss, and the
    sliding-window perplexity of its "Perplexity of fixed-length models" guide, at several strides."""
    compiled_lm(LM)
    hf = hugging_face_lm(tmp_path, "tied")
    ours = load_lm(tmp_path, device="cpu")
    positions = torch.from_numpy(np.maximum(PADDED_MASK.cumsum(axis=1) - 1, 0))
    with torch.no_grad():
        logits = hf(
            torch.from_numpy(PADDED), attention_mask=torch.from_numpy(PADDED_MASK), position_ids=positions
        )
    expected = torch.log_softmax(logits.logits.double(), dim=-1).numpy()
    lp = ours.logprobs(PADDED, PADDED_MASK)
    for row, column in zip(*np.nonzero(~np.isnan(lp)), strict=True):
        assert lp[row, column] == pytest.approx(expected[row, column - 1, PADDED[row, column]], abs=1e-4)

    ids = np.random.default_rng(3).integers(0, LM.vocab_size, 3 * LM.n_positions + 7)
    with torch.no_grad():
        loss = hf(
            torch.from_numpy(ids[None, : LM.n_positions]),
            labels=torch.from_numpy(ids[None, : LM.n_positions]),
        )
    assert -np.mean(ours.logprobs(ids[None, : LM.n_positions])[0, 1:]) == pytest.approx(
        loss.loss.item(), rel=1e-4
    )
    for stride in (LM.n_positions, 24, 17):
        nll_sum, counted, previous_end = 0.0, 0, 0
        for begin in range(0, ids.size, stride):  # the guide's loop, with Hugging Face's own loss
            end = min(begin + LM.n_positions, ids.size)
            window = torch.from_numpy(ids[None, begin:end])
            targets = window.clone()
            targets[:, : -(end - previous_end)] = -100
            with torch.no_grad():
                loss = hf(window, labels=targets).loss.item()
            # The labels shift inside: position 0 predicts nothing. (The guide subtracts one token per
            # window even where position 0 is only context; its mean loss is over these.)
            scored = int((targets[:, 1:] != -100).sum())
            nll_sum, counted, previous_end = nll_sum + loss * scored, counted + scored, end
            if end == ids.size:
                break
        result = ours.perplexity(ids, stride=stride)
        assert result.tokens == counted
        assert result.perplexity == pytest.approx(np.exp(nll_sum / counted), rel=1e-4)


@pytest.mark.parametrize("vocab_size", [300, 1000])
def test_save_pretrained_from_default_token_ids_loads_and_generates(tmp_path, vocab_size):
    """Hugging Face's GPT2Config(vocab_size=300) keeps eos_token_id 50256, an id its model cannot
    produce; it loads and runs there, so it does here: the same logits, the same greedy tokens."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(1)
    shapes = {"n_embd": LM.n_embd, "n_head": LM.n_head, "n_layer": LM.n_layer, "n_positions": LM.n_positions}
    config = transformers.GPT2Config(vocab_size=vocab_size, initializer_range=0.1, **shapes)
    assert config.eos_token_id == 50256
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=rf"eos_token_id \[50256\] is not below vocab_size \({vocab_size}\)"):
        ours = load_lm(tmp_path, device="cpu")
    ids = np.random.default_rng(4).integers(0, vocab_size, (2, 6))
    with torch.no_grad():
        hf_logits = hf(torch.from_numpy(ids)).logits.numpy()
        hf_tokens = hf.generate(
            torch.from_numpy(ids), max_new_tokens=20, do_sample=False, pad_token_id=0
        ).numpy()
    assert compare(ours.logits(ids), hf_logits.astype(np.float64), "float32").passed
    np.testing.assert_array_equal(ours.generate(ids, 20, eos_token_id=ours.config.stop_token_ids), hf_tokens)

    # eos_token_id as a list: generation ends at whichever comes first, there and here.
    stops = [int(hf_tokens[0, 6 + 4]), int(hf_tokens[1, 6 + 2])]
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "eos_token_id": stops}))
    ours = load_lm(tmp_path, device="cpu")
    assert ours.config.stop_token_ids == tuple(stops)
    with torch.no_grad():
        hf_stopped = hf.generate(
            torch.from_numpy(ids), max_new_tokens=20, do_sample=False, eos_token_id=stops, pad_token_id=0
        ).numpy()
    ended = ours.generate(ids, 20, eos_token_id=ours.config.stop_token_ids)
    for row in range(2):  # equal up to each row's end; after it Hugging Face pads, we repeat the end
        end = 6 + np.flatnonzero(np.isin(hf_stopped[row, 6:], stops))[0] + 1
        np.testing.assert_array_equal(ended[row, :end], hf_stopped[row, :end])


# Generation's controls, several sequences and beam search against Hugging Face's generate.


def hugging_face_generate(hf, ids, mask=None, **options) -> np.ndarray:
    """Hugging Face's `generate` on `ids` [B, S] (int64) with `options`; int64 [B', S + new]."""
    with torch.no_grad():
        attention = None if mask is None else torch.from_numpy(mask)
        return hf.generate(torch.from_numpy(ids), attention_mask=attention, **options).numpy()


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ({"repetition_penalty": 1.6}, {"repetition_penalty": 1.6}),
        ({"no_repeat_ngram_size": 2}, {"no_repeat_ngram_size": 2}),
        (
            {"repetition_penalty": 0.7, "no_repeat_ngram_size": 3},
            {"repetition_penalty": 0.7, "no_repeat_ngram_size": 3},
        ),
    ],
    ids=["repetition_penalty", "no_repeat_ngram_size", "both"],
)
def test_controlled_greedy_matches_hugging_face(tmp_path, compiled_lm, ours, theirs):
    compiled_lm(LM)
    hf = hugging_face_lm(tmp_path, "tied")
    lm = load_lm(tmp_path, device="cpu")
    ids = np.random.default_rng(7).integers(1, LM.vocab_size, (2, 6))
    expected = hugging_face_generate(
        hf, ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0, **theirs
    )
    got = lm.generate(ids, 24, sampler=Sampler(**ours))
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(got, lm.generate(ids, 24))


def test_a_penalised_left_padded_batch_matches_hugging_face(tmp_path, compiled_lm):
    """Every row holds a real token 0, the pad id: Hugging Face penalises the pad id of a padded row as a
    token of it (our padding is no token), so only there would the two differ."""
    compiled_lm(LM)
    hf = hugging_face_lm(tmp_path, "tied")
    lm = load_lm(tmp_path, device="cpu")
    ids = np.array([[0, 0, 0, 11, 0, 13, 14, 15], [21, 0, 23, 24, 25, 26, 27, 28], [0, 0, 0, 0, 0, 0, 0, 32]])
    mask = (np.arange(8)[None, :] >= np.array([[3], [0], [6]])).astype(np.int64)
    expected = hugging_face_generate(
        hf,
        ids,
        mask,
        max_new_tokens=20,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        repetition_penalty=1.5,
    )
    np.testing.assert_array_equal(
        lm.generate(ids, 20, mask, sampler=Sampler(repetition_penalty=1.5)), expected
    )


def test_min_new_tokens_matches_hugging_face_where_greedy_ends_early(tmp_path, compiled_lm):
    compiled_lm(LM)
    hf = hugging_face_lm(tmp_path, "tied")
    lm = load_lm(tmp_path, device="cpu")
    ids = np.random.default_rng(2).integers(1, LM.vocab_size, (1, 5))
    eos = int(lm.generate(ids, 2)[0, -1])  # greedy's second token ends the text
    expected = hugging_face_generate(
        hf, ids, max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=eos, min_new_tokens=9
    )
    assert expected.shape[1] > 5 + 2  # the minimum kept it going
    got = lm.generate(ids, 16, eos_token_id=eos, min_new_tokens=9)
    np.testing.assert_array_equal(got[:, : expected.shape[1]], expected)  # after its end, eos repeats


@pytest.mark.parametrize(
    ("stop", "length_penalty", "early_stopping"),
    [(False, 1.0, False), (True, 1.0, False), (True, 0.5, True), (True, 2.0, "never"), (True, -1.0, False)],
)
def test_beam_search_matches_hugging_face(tmp_path, compiled_lm, stop, length_penalty, early_stopping):
    compiled_lm(LM)
    hf = hugging_face_lm(tmp_path, "tied")
    lm = load_lm(tmp_path, device="cpu")
    ids = np.random.default_rng(11).integers(1, LM.vocab_size, (2, 5))
    eos = int(lm.generate(ids, 3)[0, -1]) if stop else None  # a token the beams meet early
    options = {"num_beams": 4, "num_return_sequences": 3, "length_penalty": length_penalty}
    options["early_stopping"] = early_stopping
    expected = hugging_face_generate(
        hf, ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos or 0, **options
    )
    got = lm.generate(ids, 12, eos_token_id=eos, pad_token_id=eos or 0, **options)
    np.testing.assert_array_equal(got, expected)


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
@settings(max_examples=40, deadline=None)
def test_min_p_keeps_the_candidates_hugging_faces_warper_keeps(seed, min_p):
    logits = np.random.default_rng(seed).standard_normal((3, 50)) * 3
    warper = transformers.generation.logits_process.MinPLogitsWarper(min_p)
    theirs = np.isfinite(warper(None, torch.from_numpy(logits)).numpy())
    ours = np.isfinite(Sampler(do_sample=True, min_p=min_p).candidates(logits))
    np.testing.assert_array_equal(ours, theirs)
