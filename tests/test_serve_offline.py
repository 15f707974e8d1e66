"""What `max-gpt2 serve` decides without a server running: the served graph's positions, the
requests its tokenizer refuses, and the checkpoints it refuses before starting. Everything skips,
saying why, where MAX's serving extra is not installed (`pip install -e '.[serve]'`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental.tensor import Tensor, TensorType

from tests.support import LM, requires_serving, run_python

pytestmark = requires_serving()


def test_echo_without_the_prompts_logits_is_refused_per_request():
    """A server started without --enable-echo refuses echo with logprobs as a bad request (HTTP 400)."""
    import asyncio

    from max.pipelines.context.exceptions import InputError
    from max.pipelines.modeling.types import TextGenerationRequest

    from max_gpt2.serving.tokenizer import GPT2TextTokenizer

    tokenizer = GPT2TextTokenizer.__new__(GPT2TextTokenizer)  # only its check, no files read
    tokenizer.echo_enabled = False
    request = TextGenerationRequest(request_id="r", model_name="gpt2", prompt="hi", logprobs=1, echo=True)
    with pytest.raises(InputError, match="start it with --enable-echo"):
        asyncio.run(tokenizer.new_context(request))


def compile_positions() -> Callable[..., Tensor]:
    """`ragged_positions` alone as a graph: (row offsets, cache lengths, tokens [T]) -> positions [T]."""
    from max.experimental.nn import Module

    from max_gpt2.serving.paged_gpt2 import ragged_positions

    class Positions(Module[[Tensor, Tensor, Tensor], Tensor]):
        def forward(self, offsets: Tensor, cache_lengths: Tensor, tokens: Tensor) -> Tensor:
            return ragged_positions(offsets, cache_lengths, tokens.shape[0])

    cpu = CPU()
    types = [TensorType(DType.uint32, [name], device=cpu) for name in ("rows", "requests")]
    return Positions().compile(*types, TensorType(DType.int64, ["tokens"], device=cpu))


def test_ragged_positions_count_from_each_requests_cache():
    """Several requests in one batch: positions resume each request's cache."""
    positions = compile_positions()
    rng = np.random.default_rng(0)
    for lengths, cached in [
        ([3, 1, 4], [5, 0, 2]),
        ([1], [7]),
        (list(rng.integers(1, 9, 6)), list(rng.integers(0, 30, 6))),
    ]:
        offsets = np.cumsum([0, *lengths]).astype(np.uint32)
        expected = np.concatenate(
            [np.arange(past, past + n) for n, past in zip(lengths, cached, strict=True)]
        )
        inputs = (offsets, np.array(cached, np.uint32), np.zeros(offsets[-1], np.int64))
        result = positions(*(Buffer.from_numpy(array) for array in inputs))
        np.testing.assert_array_equal(np.from_dlpack(result), expected)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no tokenizer", "has no tokenizer"),
        ("no architectures", "architectures"),
        ("bfloat16 on cpu", "MAX serves float32 on CPU"),
        ("a smaller tokenizer", "vocab_size=320 is more than its tokenizer's 300 tokens"),
    ],
)
def test_serve_refuses_what_it_cannot_serve_before_starting(change, message, lm_checkpoint, tmp_path):
    checkpoint = tmp_path / "gpt2"
    checkpoint.mkdir()
    tokenizer_files = ("tokenizer.json", "vocab.json", "merges.txt")
    for file in lm_checkpoint(LM).iterdir():
        if not (change == "no tokenizer" and file.name in tokenizer_files):
            (checkpoint / file.name).write_bytes(file.read_bytes())
    if change == "a smaller tokenizer":  # a 300-token tokenizer beside a 320-id embedding
        for file in lm_checkpoint(dataclasses.replace(LM, vocab_size=300)).iterdir():
            if file.name in tokenizer_files:
                (checkpoint / file.name).write_bytes(file.read_bytes())
    if change == "no architectures":
        config = json.loads((checkpoint / "config.json").read_text())
        (checkpoint / "config.json").write_text(json.dumps({**config, "architectures": None}))
    dtype = "bfloat16" if change == "bfloat16 on cpu" else "float32"
    result = run_python(
        "-m", "max_gpt2", "serve", "--checkpoint", checkpoint, "--device", "cpu", "--dtype", dtype
    )
    assert result.returncode == 2
    assert message in result.stderr
