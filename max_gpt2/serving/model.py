"""The pipeline model `max serve` drives: reads our checkpoint, compiles `PagedGPT2LMHeadModel`.

MAX's `ModuleV3PipelineModelWithKVCache` does the rest: it sizes and manages the
paged KV cache, batches requests into ragged inputs (MAX's own batch processor
and inputs, shared with its Llama 3 architecture: tokens, row offsets, the
flattened cache), runs the graph once per step and samples. MAX's
`LogProbabilitiesMixin` answers OpenAI's `logprobs` (up to 7 alternatives) from
the graph's logits, and with `echo` the prompt's too, from every token's logits
(a server started with `--enable-echo`; `max-gpt2 serve` starts it so).

Weights are read by `max_gpt2.model.checkpoint.Checkpoint`, the adapter `load_lm` uses:
both key layouts, Conv1D transposed, the head tied to `wte` unless the
checkpoint unties it, every shape checked against `config.json`, the same errors.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from max import tree
from max.driver import CPU, Buffer
from max.engine import InferenceSession
from max.nn.kv_cache import KVCacheInputsPerDevice
from max.pipelines.architectures.llama3_modulev3.batch_processor import Llama3ModuleV3BatchProcessor
from max.pipelines.architectures.llama3_modulev3.inputs import Llama3Inputs
from max.pipelines.context import LogProbabilities, TextContext
from max.pipelines.lib import ModelOutputs, ModuleV3PipelineModelWithKVCache
from max.pipelines.lib.log_probabilities import LogProbabilitiesMixin

from max_gpt2.inference.devices import to_buffer
from max_gpt2.kernels import kernels_run_on
from max_gpt2.model.checkpoint import Checkpoint
from max_gpt2.serving.model_config import GPT2ServingConfig
from max_gpt2.serving.paged_gpt2 import PagedGPT2LMHeadModel


class GPT2PipelineModel(LogProbabilitiesMixin, ModuleV3PipelineModelWithKVCache[TextContext]):
    """GPT-2 for MAX's text-generation pipeline, on MAX's paged KV cache, with log-probabilities."""

    model_config_cls: ClassVar[type[Any]] = GPT2ServingConfig
    batch_processor_cls: ClassVar[type[Llama3ModuleV3BatchProcessor]] = Llama3ModuleV3BatchProcessor

    def _load_state_dict(self) -> dict[str, np.ndarray]:
        return Checkpoint(self.pipeline_config.model.model_path).model_weights()  # float32, MAX layout

    def _create_model_config(self, state_dict: dict[str, Any]) -> GPT2ServingConfig:
        return GPT2ServingConfig.initialize(self.pipeline_config, max_seq_len=self.max_seq_len)

    def _prepare_state_dict(
        self, state_dict: dict[str, Any], model_config: GPT2ServingConfig
    ) -> dict[str, Any]:
        return {name: to_buffer(array, model_config.dtype, CPU()) for name, array in state_dict.items()}

    def _instantiate_module(self, model_config: GPT2ServingConfig) -> PagedGPT2LMHeadModel:
        kernels = kernels_run_on(self.devices[0], model_config.dtype)  # the CPU in float32
        module = PagedGPT2LMHeadModel(model_config.model, self.kv_params, self.return_logits, kernels)
        module.to(self.devices[0])
        return module

    def compute_log_probabilities(
        self,
        session: InferenceSession,
        model_inputs: Llama3Inputs,
        model_outputs: ModelOutputs,
        next_tokens: Buffer,
        batch_top_n: list[int],
        batch_echo: list[bool],
    ) -> list[LogProbabilities | None]:
        """MAX's log-probabilities, with the first prompt token's (there is none: NaN) put in front.

        OpenAI's `echo` lists every prompt token, the first with no log-probability
        (null), and clients such as lm-evaluation-harness index the list by prompt
        position; MAX's starts at the second token. NaN goes out as JSON null.
        """
        results = super().compute_log_probabilities(
            session, model_inputs, model_outputs, next_tokens, batch_top_n, batch_echo
        )
        if not any(batch_echo):
            return results
        (cache,) = tree.leaves(model_inputs.kv_cache_inputs, leaf=KVCacheInputsPerDevice)
        cached = cache.cache_lengths.to_numpy()  # [R]: tokens of each request before this step
        first_tokens = model_inputs.tokens.to_numpy()[model_inputs.input_row_offsets.to_numpy()[:-1]]
        for row, result in enumerate(results):
            if batch_echo[row] and result is not None and cached[row] == 0:  # this step holds the prompt
                results[row] = LogProbabilities(
                    token_log_probabilities=[math.nan, *result.token_log_probabilities],
                    top_log_probabilities=[{}, *result.top_log_probabilities],
                    sampled_token_ids=[int(first_tokens[row]), *result.sampled_token_ids],
                )
        return results
