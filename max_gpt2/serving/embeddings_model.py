"""The model MAX's embeddings pipeline drives (`max-gpt2 serve --embeddings`): the library's LM, pooled.

A `max serve` started with `--task embeddings_generation` runs MAX's `EmbeddingsPipeline`, which
makes this model (its session and weights are left unused: the checkpoint is loaded as `load_lm`
loads it, through the weights cache, in the served weight format), asks it for a batch's inputs,
runs it, and sends each request its row of the output back whole. A batch is the requests' token ids
left-padded into one `[R, S]` prompt; the output is one vector a request, float32 `[R, n_embd]`,
pooled as the server was started (`ServingSettings.pooling`) and not normalised: each request names
its norm, which the route applies (`max_gpt2.serving.api.embeddings`). Plain `max serve`, without
`max-gpt2 serve`'s settings, answers with MAX's own route, which normalises nothing: there the model
pools the last token's state, vLLM's default for a causal LM, and gives it a Euclidean length of 1,
as OpenAI's embeddings have. Only the graph returning the
final layer norm's output is compiled (`LMGraphs.hidden`); no KV cache is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from max.driver import Buffer, Device
from max.pipelines.lib import ModelInputs, ModelOutputs, PipelineConfig
from max.pipelines.modeling.config_enums import supported_encoding_dtype

from max_gpt2.inference.embeddings import Pooling, embed
from max_gpt2.inference.loading import compiled_with, plan_load
from max_gpt2.max_internals import served_encoding
from max_gpt2.serving.model_config import opened_served, served_weight_format
from max_gpt2.serving.settings import ServingSettings


@dataclass
class PaddedPrompts(ModelInputs):
    """A batch's token ids, int64 `[R, S]` left-padded, and its attention mask (1: a token)."""

    ids: np.ndarray
    mask: np.ndarray


class GPT2EmbeddingsModel:
    """GPT-2 for MAX's `EmbeddingsPipeline`: `prepare_initial_token_inputs`, then `execute` (module
    docstring). Not a MAX `PipelineModel`, so MAX plans no KV cache for it."""

    def __init__(
        self, pipeline_config: PipelineConfig, session: Any, devices: list[Device], *args: Any, **kwargs: Any
    ) -> None:
        settings = ServingSettings.from_environment()
        # Our route normalises per request; under plain `max serve` MAX's route answers, which does not.
        self.pooling, self.norm = (settings.pooling, -1) if settings.pooling else (Pooling.LAST, 2)
        checkpoint = opened_served(pipeline_config.model)
        weight_format = served_weight_format(lambda: checkpoint)
        dtype = supported_encoding_dtype(served_encoding(pipeline_config.model, "float32"))
        plan = plan_load(checkpoint, devices[0], dtype, weight_format=weight_format)
        graphs = plan.graphs()
        self.lm = compiled_with(graphs, plan.weights(), [graphs.hidden])

    def prepare_initial_token_inputs(
        self, replica_batches: Sequence[Sequence[Any]], **_: Any
    ) -> PaddedPrompts:
        """The requests' prompts (MAX's contexts, in the batch's order) left-padded into one batch."""
        prompts = [np.asarray(context.tokens.prompt) for batch in replica_batches for context in batch]
        width = max(len(prompt) for prompt in prompts)
        ids = np.zeros((len(prompts), width), np.int64)
        mask = np.zeros((len(prompts), width), np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
        return PaddedPrompts(ids, mask)

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        """One vector a request, float32 `[R, n_embd]`, pooled (normalised only under plain `max serve`)."""
        assert isinstance(model_inputs, PaddedPrompts)
        vectors = embed(self.lm, model_inputs.ids, model_inputs.mask, self.pooling, self.norm)
        return ModelOutputs(logits=Buffer.from_numpy(np.ascontiguousarray(vectors)))
