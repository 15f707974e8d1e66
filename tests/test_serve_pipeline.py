"""`max_gpt2.serving.pipeline` without a model or a server: which steps skip MAX's sampler, and how
many tokens a decoding step runs.

MAX's `TextContext` and `TextGenerationInputs` are real; the graph, the KV cache manager
and MAX's own `_execute` are stubbed, so each test sees exactly what the pipeline asked of them.
Everything skips, saying why, where MAX's serving extra is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from max.driver import Buffer

from tests.support import requires_serving

pytestmark = requires_serving()


def bare(kind: type) -> Any:
    """A pipeline of `kind` with no model and nothing compiled: no constraint's grammar, no DRY's breakers."""
    from max_gpt2.serving.constraints import ServedConstraints

    pipeline = kind.__new__(kind)
    pipeline._constraints = ServedConstraints(lambda: None)
    pipeline._tokenizer = SimpleNamespace(dry_heads=lambda breakers: {})
    return pipeline


def text_context(
    sampling: dict[str, Any], max_length: int = 16, prompt: Sequence[int] = (0, 1, 2), **asks: Any
) -> Any:
    """A request's context as MAX's tokenizer makes it: `prompt`'s tokens, `sampling`'s parameters."""
    from max.pipelines.context import TextContext
    from max.pipelines.context.sampling_params import SamplingParams
    from max.pipelines.context.tokens import TokenBuffer

    return TextContext(
        max_length=max_length,
        tokens=TokenBuffer(np.array(prompt, dtype=np.int64)),
        sampling_params=SamplingParams(**sampling),
        **asks,
    )


@pytest.mark.parametrize(
    ("params", "asks", "argmax"),
    [
        ({"temperature": 0}, {}, True),
        ({"top_k": 1, "temperature": 0.7}, {}, True),
        ({"temperature": 0, "top_p": 0.5, "min_p": 0.1}, {}, True),
        ({"temperature": 0.7}, {}, False),
        # Penalties and a minimum length edit the logits before either way picks (`controlled`).
        ({"temperature": 0, "frequency_penalty": 0.5}, {}, True),
        ({"temperature": 0, "repetition_penalty": 1.2}, {}, True),
        ({"temperature": 0, "min_new_tokens": 3}, {}, True),
        ({"temperature": 0, "logits_processors": [lambda inputs: None]}, {}, False),
        ({"temperature": 0}, {"log_probabilities": 1}, False),
        ({"temperature": 0}, {"json_schema": "{}"}, False),
        ({"temperature": 0}, {"label_token_ids": [3, 5]}, False),
    ],
)
def test_only_requests_whose_token_is_the_argmax_skip_maxs_sampler(params, asks, argmax):
    from max_gpt2.serving.pipeline import argmax_applies

    assert argmax_applies(text_context(params, **asks)) is argmax


def test_penalties_and_a_minimum_length_edit_only_their_own_requests_logits(monkeypatch):
    """What the model gives goes to MAX's sampler and our argmax with each request's penalties applied
    (its prompt is ids 0, 1, 2) and, before `min_new_tokens`, its end-of-text banned; a request
    asking for neither keeps its row as it was."""
    from max.pipelines.context import EOSTracker
    from max.pipelines.lib import ModelOutputs, TextGenerationPipeline

    from max_gpt2.inference.logit_controls import LOWEST
    from max_gpt2.serving.pipeline import GPT2TextGenerationPipeline

    rows = np.array([[2.0, -1.0, 4.0, 1.0, 3.0]] * 3, np.float32)
    given = Buffer.from_numpy(rows)
    monkeypatch.setattr(
        TextGenerationPipeline,
        "_launch_forward_pass",
        lambda self, *args, **kwargs: ModelOutputs(given, given),
    )
    pipeline = bare(GPT2TextGenerationPipeline)
    contexts = [
        text_context({"temperature": 0, "repetition_penalty": 2.0}),
        text_context({"temperature": 0}),
        text_context({"temperature": 0.5, "min_new_tokens": 2}, eos_tracker=EOSTracker(eos_token_ids={4})),
    ]
    got = pipeline._launch_forward_pass(None, contexts, 0).next_token_logits.to_numpy()
    np.testing.assert_array_equal(got[0], [1.0, -2.0, 2.0, 1.0, 3.0])  # ids 0-2 penalised, 3 and 4 not
    np.testing.assert_array_equal(got[1], rows[1])
    np.testing.assert_array_equal(got[2], [2.0, -1.0, 4.0, 1.0, LOWEST])


def test_llama_servers_penalties_count_only_the_contexts_last_tokens(monkeypatch):
    """A context with `penalty_last_n` (llama-server's `repeat_last_n`) has all three penalties count its
    last n tokens, prompt and text alike; 0 counts none."""
    from max.pipelines.context.sampling_params import SamplingParams
    from max.pipelines.context.tokens import TokenBuffer
    from max.pipelines.lib import ModelOutputs, TextGenerationPipeline

    from max_gpt2.serving.context import GPT2Context
    from max_gpt2.serving.pipeline import GPT2TextGenerationPipeline

    rows = np.array([[2.0, -1.0, 4.0, 1.0, 3.0]] * 2, np.float32)
    given = Buffer.from_numpy(rows)
    monkeypatch.setattr(
        TextGenerationPipeline, "_launch_forward_pass", lambda self, *a, **k: ModelOutputs(given, given)
    )
    pipeline = bare(GPT2TextGenerationPipeline)
    penalties = {
        "temperature": 0,
        "repetition_penalty": 2.0,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
    }
    contexts = [
        GPT2Context(
            max_length=16,
            tokens=TokenBuffer(np.array([0, 1, 2, 1], np.int64)),
            sampling_params=SamplingParams(**penalties),
            penalty_last_n=last,
        )
        for last in (3, 0)
    ]
    got = pipeline._launch_forward_pass(None, contexts, 0).next_token_logits.to_numpy()
    # The last 3 tokens are 1, 2, 1: id 1 twice (-1 * 2 - 2 * 0.5 - 0.25), id 2 once (4 / 2 - 0.75).
    np.testing.assert_allclose(got[0], [2.0, -3.25, 1.25, 1.0, 3.0])
    np.testing.assert_array_equal(got[1], rows[1])


def stub_pipeline(
    logits: Callable[[int], np.ndarray],
    on_host: bool = True,
    full_after: int | None = None,
    decode_steps: int = 4,
):
    """`GPT2TextGenerationPipeline` without a model, decoding up to `decode_steps` tokens a step: the
    graph's last-token logits `[R, V]` for its n-th run are `logits(n)`; its KV cache records each
    step and claim, and has room for `full_after` claims."""
    from max.pipelines.kv_cache import InsufficientBlocksError
    from max.pipelines.lib import ModelOutputs

    from max_gpt2.serving.pipeline import GPT2TextGenerationPipeline

    class Cache:
        def __init__(self) -> None:
            self.steps: list[Any] = []
            self.claims: list[Any] = []

        def step(self, context: Any) -> None:
            self.steps.append(context)

        def alloc(self, context: Any) -> None:
            if full_after is not None and len(self.claims) == full_after:
                raise InsufficientBlocksError("no page left")
            self.claims.append(context)

    def forward(inputs: Any, batch: list[Any], step: int) -> ModelOutputs:
        rows = Buffer.from_numpy(logits(len(runs)).astype(np.float32))
        runs.append([context.tokens.active_length for context in batch])
        return ModelOutputs(rows, rows)

    class Stubbed(GPT2TextGenerationPipeline):
        kv_manager = Cache()  # in place of MAX's property

    runs: list[list[int]] = []
    pipeline = Stubbed.__new__(Stubbed)  # no model, no compile
    pipeline._on_host = on_host
    pipeline._decode_steps = decode_steps
    pipeline._drafts = None
    pipeline.prepare_batch = lambda batches: (None, None, [c for batch in batches for c in batch])
    pipeline._launch_forward_pass = forward
    pipeline.runs = runs
    return pipeline


@pytest.mark.parametrize(
    ("second_request", "device", "argmax"),
    [
        ({"temperature": 0}, "cpu", True),
        ({"temperature": 0.7}, "cpu", False),
        ({"temperature": 0}, "gpu", False),
    ],
)
def test_a_step_takes_the_argmax_only_when_every_request_allows_it_on_a_cpu(
    second_request, device, argmax, monkeypatch
):
    """The pipeline's routing, the model and MAX's step stubbed: an all-greedy step on a CPU gets each
    row's argmax and steps the cache for each request, once, as a step with a prompt in it goes no
    further; one sampled request, or an accelerator, sends the whole step to MAX's `_execute`."""
    from max.pipelines.lib import TextGenerationPipeline
    from max.pipelines.modeling.types import TextGenerationInputs

    logits = np.array([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.0, 3.5]])
    maxs_steps = []
    monkeypatch.setattr(
        TextGenerationPipeline, "_execute", lambda self, inputs: maxs_steps.append(inputs) or {}
    )
    pipeline = stub_pipeline(lambda run: logits, on_host=device == "cpu")
    contexts = [text_context({"temperature": 0}), text_context(second_request)]
    responses = pipeline._execute(TextGenerationInputs(batches=[contexts]))
    if argmax:
        assert [responses[context.request_id].tokens for context in contexts] == [[1], [3]]
        assert pipeline.kv_manager.steps == contexts and not maxs_steps and pipeline.runs == [[3, 3]]
    else:
        assert len(maxs_steps) == 1 and not pipeline.kv_manager.steps and not responses


@pytest.mark.parametrize(
    ("second_length", "full_after", "steps"),
    [(16, None, 4), (6, None, 2), (16, 3, 2), (16, 0, 1)],
)
def test_a_decoding_step_goes_on_until_a_request_ends_or_the_cache_is_full(second_length, full_after, steps):
    """Requests that are all decoding get up to `--decode-steps` tokens (4 here) from one step, each
    run's argmax fed to the next run as its one new token, the cache stepped after each run and
    claimed before each further one; a request reaching its length (`second_length`: 3 prompt
    tokens, 1 generated before) or a cache with no room left (after `full_after` claims) ends the
    step there."""
    from max.pipelines.modeling.types import TextGenerationInputs

    vocab = 10
    pipeline = stub_pipeline(lambda run: np.eye(vocab)[[run, vocab - 1 - run]], full_after=full_after)
    contexts = [text_context({"temperature": 0}), text_context({"temperature": 0}, max_length=second_length)]
    for context in contexts:  # each has had its prompt's step
        context.advance_token_buffer(new_token=vocab)
        context.to_generation_output()
    responses = pipeline._execute(TextGenerationInputs(batches=[contexts]))
    assert [responses[context.request_id].tokens for context in contexts] == [
        list(range(steps)),
        [vocab - 1 - run for run in range(steps)],
    ]
    assert pipeline.runs == [[1, 1]] * steps
    assert pipeline.kv_manager.steps == contexts * steps
    assert len(pipeline.kv_manager.claims) == 2 * (steps - 1) + (full_after is not None and full_after % 2)
    assert contexts[1].is_done == (second_length == 6)


def test_a_decoding_step_ends_before_one_more_run_would_pass_its_time_budget(monkeypatch):
    """Runs that each take 1/4.5 of `DECODE_BUDGET_S` (a stubbed clock): a fifth would end past the
    budget, so a step allowed 16 runs makes 4, and claims cache room for the 3 after the first only."""
    from max.pipelines.modeling.types import TextGenerationInputs

    from max_gpt2.serving import pipeline as served

    clock = [0.0]
    monkeypatch.setattr(served, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def run_taking_its_time(run: int) -> np.ndarray:
        clock[0] += served.DECODE_BUDGET_S / 4.5
        return np.eye(16)[[run]]

    pipeline = stub_pipeline(run_taking_its_time, decode_steps=16)
    context = text_context({"temperature": 0})
    context.advance_token_buffer(new_token=15)  # past its prompt
    context.to_generation_output()
    responses = pipeline._execute(TextGenerationInputs(batches=[[context]]))
    assert responses[context.request_id].tokens == [0, 1, 2, 3]
    assert len(pipeline.kv_manager.claims) == 3


def successor_pipeline(
    successor: np.ndarray,
    prompt_lookup: int | None,
    monkeypatch: pytest.MonkeyPatch,
    seconds: Callable[[int], float] = lambda rows: 1.0 + 0.01 * rows,
):
    """`GPT2TextGenerationPipeline` on a stubbed model whose greedy token after token x is `successor[x]`
    whatever came before, drafting up to `prompt_lookup` tokens by prompt lookup (None: not at all),
    a run of T tokens taking `seconds(T)` on the pipeline's (stubbed) clock. `pipeline.runs` lists
    each run's tokens a request."""
    from max.pipelines.lib import ModelOutputs

    from max_gpt2.serving import pipeline as served
    from max_gpt2.serving.drafts import CheckedDrafts, ServedDrafts
    from max_gpt2.serving.pipeline import GPT2TextGenerationPipeline

    clock = [0.0]
    monkeypatch.setattr(served, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    vocab = len(successor)

    class Cache:
        def step(self, context: Any) -> None:
            pass

        def alloc(self, context: Any) -> None:
            pass

    class Stubbed(GPT2TextGenerationPipeline):
        kv_manager = Cache()

    def prepare_batch(batches: list[list[Any]]) -> tuple[Any, None, list[Any]]:
        from max.pipelines.architectures.llama3_modulev3.inputs import Llama3Inputs

        flat = [context for batch in batches for context in batch]
        tokens = np.concatenate([context.tokens.active for context in flat])
        offsets = np.cumsum([0] + [context.tokens.active_length for context in flat]).astype(np.uint32)
        ones = Buffer.from_numpy(np.ones(1, np.int64))
        return Llama3Inputs(Buffer.from_numpy(tokens), Buffer.from_numpy(offsets), ones), None, flat

    def forward(inputs: Any, batch: list[Any], step: int) -> ModelOutputs:
        tokens, offsets = inputs.tokens.to_numpy(), inputs.input_row_offsets.to_numpy()
        runs.append(np.diff(offsets).tolist())
        clock[0] += seconds(len(tokens))
        every = Buffer.from_numpy(np.eye(vocab, dtype=np.float32)[successor[tokens]])  # [T, V]
        if isinstance(inputs, CheckedDrafts):
            for context, size in zip(batch, np.diff(offsets), strict=True):  # as the model's positions allow
                last = len(context.tokens.all) - 2 + size  # the position of its run's last token
                assert last < context.max_length, f"a run of {size} tokens reaches position {last}"
            return ModelOutputs(logits=every, logit_offsets=inputs.input_row_offsets)
        last = Buffer.from_numpy(every.to_numpy()[offsets[1:] - 1])
        return ModelOutputs(last, last)

    runs: list[list[int]] = []
    pipeline = Stubbed.__new__(Stubbed)
    pipeline._on_host, pipeline._decode_steps = True, 1000  # no time budget: each run a step
    pipeline._drafts = ServedDrafts(prompt_lookup) if prompt_lookup else None
    pipeline.prepare_batch = prepare_batch
    pipeline._launch_forward_pass = forward
    pipeline.runs = runs
    return pipeline


def served_tokens(pipeline: Any, contexts: list[Any], steps: int = 100) -> list[list[int]]:
    """Each request's tokens after its prompt, through `pipeline`'s scheduler steps until every request
    is done (the first step runs the prompts)."""
    from max.pipelines.modeling.types import TextGenerationInputs

    tokens: list[list[int]] = [[] for _ in contexts]
    for _ in range(steps):
        running = [context for context in contexts if not context.is_done]
        if not running:
            return tokens
        responses = pipeline._execute(TextGenerationInputs(batches=[running]))
        for i, context in enumerate(contexts):
            if context.request_id in responses:
                tokens[i] += responses[context.request_id].tokens
    raise AssertionError("the requests never ended")


@pytest.mark.parametrize(
    ("prompts", "max_lengths", "eos"),
    [
        ([[1, 2, 3, 1]], [30], None),  # the text cycles through its prompt: drafts kept whole
        ([[1, 2, 9, 4, 1]], [30], None),  # the prompt says 2 follows 1, then 9: the model says 3
        ([[5, 6, 7, 5], [1, 2, 9, 4, 1], [8]], [40, 23, 12], None),  # three requests, their own lengths
        ([[1, 2, 3, 4, 1]], [30], 4),  # end-of-text in the middle of a kept draft
    ],
)
def test_prompt_lookup_keeps_what_the_model_chooses_and_nothing_else(prompts, max_lengths, eos, monkeypatch):
    """A stubbed model (token x is always followed by successor[x]) served with and without prompt
    lookup: each request gets the same tokens in both, the drafted server in fewer runs, with
    S = 1 + the longest draft tokens for every request of a run, no request's run reaching past its
    max_length (the stubbed model refuses it as the real one's positions would)."""
    from max.pipelines.context import EOSTracker

    successor = np.array([1, 2, 3, 1, 5, 6, 7, 5, 0, 0, 0])  # 1 -> 2 -> 3 -> 1, 5 -> 6 -> 7 -> 5
    results = {}
    for lookup in (None, 8):
        pipeline = successor_pipeline(successor, lookup, monkeypatch)
        contexts = [
            text_context(
                {"temperature": 0},
                max_length=length,
                prompt=prompt,
                eos_tracker=EOSTracker(eos_token_ids={eos} if eos is not None else set()),
            )
            for prompt, length in zip(prompts, max_lengths, strict=True)
        ]
        results[lookup] = served_tokens(pipeline, contexts), pipeline.runs
    (plain, plain_runs), (drafted, drafted_runs) = results[None], results[8]
    for prompt, length, tokens in zip(prompts, max_lengths, plain, strict=True):
        expected = [int(successor[prompt[-1]])]
        while len(expected) < length - len(prompt) and expected[-1] != eos:
            expected.append(int(successor[expected[-1]]))
        assert tokens == expected  # the stub's greedy text, to its length or end-of-text
    assert drafted == plain
    assert len(drafted_runs) < len(plain_runs)
    assert all(len(set(run)) == 1 and sum(run) <= 16 for run in drafted_runs[1:])  # S each, within 16
    assert drafted_runs[1] == [1] * len(prompts)  # the first decoding run measures runs without drafts


def test_prompt_lookup_waits_while_a_request_has_its_logits_controlled(monkeypatch):
    """A request asking for a repetition penalty beside one that does not: no run checks drafts (the
    penalty applies to the logits after each kept token, which a drafted run does not compute)."""
    successor = np.array([1, 2, 3, 1])
    pipeline = successor_pipeline(successor, 8, monkeypatch)
    contexts = [
        text_context({"temperature": 0}, max_length=20, prompt=[1, 2, 3, 1]),
        text_context({"temperature": 0, "repetition_penalty": 1.0001}, max_length=20, prompt=[1, 2, 3, 1]),
    ]
    served_tokens(pipeline, contexts)
    assert all(run == [1, 1] for run in pipeline.runs[1:])


@pytest.mark.parametrize(
    ("seconds", "drafts_pay"), [(lambda rows: 1.0 + 0.01 * rows, True), (lambda rows: rows**2, False)]
)
def test_drafting_pauses_where_drafted_runs_make_fewer_tokens_a_second(seconds, drafts_pay, monkeypatch):
    """Two requests whose drafts are all kept, a run of T tokens taking `seconds(T)` on a stubbed clock:
    where a token costs a hundredth of a run, the runs go on drafting; where a run costs T squared,
    drafted runs make fewer tokens a second than runs without, and drafting pauses after each
    `JUDGED_AFTER` drafted runs, longer each time; the tokens are the same either way."""
    from max_gpt2.serving.drafts import JUDGED_AFTER

    successor = np.array([1, 2, 3, 1])
    results = {}
    for lookup in (None, 4):
        pipeline = successor_pipeline(successor, lookup, monkeypatch, seconds)
        contexts = [text_context({"temperature": 0}, max_length=400, prompt=[1, 2, 3, 1]) for _ in range(2)]
        results[lookup] = served_tokens(pipeline, contexts, steps=400), pipeline.runs
    assert results[4][0] == results[None][0]
    runs = "".join("d" if run[0] > 1 else "." for run in results[4][1][1:])  # after the prompts' run
    if drafts_pay:
        assert runs.count("d") > 0.9 * len(runs)
    else:
        pauses = [len(stretch) for stretch in runs.split("d") if stretch]
        assert runs.count("d") < len(runs) / 2
        assert pauses[:6] == [1, 1, 2, 4, 8, 16]  # the first run measures; then each pause twice as long
        assert all(len(drafted) == JUDGED_AFTER for drafted in runs.strip(".").split(".") if drafted)


def test_xtcs_draw_is_the_same_for_the_same_seed_and_token_and_uniform():
    from max_gpt2.serving.logit_edits import host_draw

    def draws(seed: int) -> list[float]:  # a request's first 8 tokens
        return [
            host_draw(
                SimpleNamespace(
                    sampling_params=SimpleNamespace(seed=seed), tokens=SimpleNamespace(generated_length=n)
                )
            )
            for n in range(8)
        ]

    assert draws(5) == draws(5) != draws(6) and len(set(draws(5))) == 8
    many = [chance for seed in range(50) for chance in draws(seed)]
    assert min(many) >= 0 and max(many) < 1 and abs(np.mean(many) - 0.5) < 0.05  # 3.5 standard errors


def test_mirostat_keeps_its_pick_alone_and_its_mu_by_token_count():
    """A step run again for the same token (its count of tokens unchanged) draws the same token from the
    same mu; the next token's mu is the update of the first's, starting at twice tau."""
    from max.pipelines.context.sampling_params import SamplingParams
    from max.pipelines.context.tokens import TokenBuffer

    from max_gpt2.inference.sampler_chain import LOWEST
    from max_gpt2.inference.token_pickers import mirostat_v2
    from max_gpt2.serving.context import GPT2Context

    context = GPT2Context(
        max_length=16,
        tokens=TokenBuffer(np.array([0, 1, 2], np.int64)),
        sampling_params=SamplingParams(),
        picker=("mirostat", 2, 1.5, 0.5),
    )
    row = np.array([2.0, 1.9, 1.8, -1.0, 0.5], np.float32)
    first, drawn = context.picked(row, 0.6)
    again, _ = context.picked(row, 0.6)
    expected, mu = mirostat_v2(row, 1.5, 0.5, 3.0, 0.6)
    np.testing.assert_array_equal(first, again)
    assert drawn.token == expected.token and drawn.ids.tolist() == expected.ids.tolist()
    assert np.flatnonzero(first > LOWEST).tolist() == [drawn.token] and context.picker_states == {
        0: (3.0,),
        1: (mu,),
    }
