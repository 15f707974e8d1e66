"""MAX's text-generation pipeline, picking greedy tokens on the host without MAX's sampler.

`max serve` runs one `TextGenerationPipeline.execute` per step: the batch's
inputs, the model's graph, then MAX's sampler, a second graph that takes
temperature, top-k, top-p, seeds, penalties and masks for every request. When
every request of a step is greedy and asks for nothing the sampler alone gives
(log-probabilities, penalties, a minimum length, a grammar, logits processors,
label scores), its token is the argmax of its row of logits `[R, V]`: on a CPU
NumPy finds it in microseconds, and a step of GPT-2 small on a 2-core EPYC took
42.2 ms this way against 46.0 ms through the sampler at batch 1, 54.6 against
57.1 at batch 8 (`benchmarks/serving_step.py`). Any other step, and every step
on an accelerator, goes through MAX's `_execute` unchanged.
"""

from __future__ import annotations

import numpy as np
from max.pipelines.context import TextContext, TextGenerationOutput
from max.pipelines.context.sampling_params import SamplingParams
from max.pipelines.lib import TextGenerationPipeline
from max.pipelines.lib.pipeline_variants.utils import update_context_and_prepare_responses
from max.pipelines.modeling.types import PipelineOutputsDict, TextGenerationInputs


def greedy_as_is(params: SamplingParams) -> bool:
    """Whether MAX's sampler would pick the argmax of the raw logits for a request with `params`."""
    return (
        params.top_k == 1  # temperature 0 sets it; top-p and min-p then keep the top token
        and not params.needs_penalties
        and params.min_new_tokens == 0
        and params.logits_processors is None
    )


def argmax_applies(context: TextContext) -> bool:
    """Whether `context`'s next token is the argmax of its logits, with nothing else asked of the step."""
    return (
        greedy_as_is(context.sampling_params)
        and not context.log_probabilities
        and context.json_schema is None
        and context.grammar is None
        and context.label_token_ids is None
    )


class GPT2TextGenerationPipeline(TextGenerationPipeline[TextContext]):
    """MAX's pipeline, with all-greedy steps on the host decided by NumPy's argmax."""

    def _execute(
        self, inputs: TextGenerationInputs[TextContext]
    ) -> PipelineOutputsDict[TextGenerationOutput]:
        contexts = inputs.flat_batch
        on_host = all(device.is_host for device in self._devices)
        if not (contexts and on_host and all(argmax_applies(context) for context in contexts)):
            return super()._execute(inputs)
        model_inputs, _, flat_batch = self.prepare_batch(inputs.batches)  # no grammar: no bitmask
        outputs = self._launch_forward_pass(model_inputs, flat_batch, step=0)
        last_rows = outputs.next_token_logits  # [R, V]: GPT2PipelineModel always gives them
        assert last_rows is not None
        new_tokens = np.argmax(last_rows.to_numpy(), axis=-1)[:, np.newaxis]  # [R, 1]
        responses = update_context_and_prepare_responses(new_tokens, flat_batch)
        for context in contexts:
            self._kv_manager.step(context)
        return responses
