"""The pipeline model `max serve` drives: reads our checkpoint, compiles `PagedGPT2LMHeadModel`.

MAX's `ModuleV3PipelineModelWithKVCache` does the rest: it sizes and manages the
paged KV cache, batches requests into ragged inputs (MAX's own batch processor
and inputs, shared with its Llama 3 architecture: tokens, row offsets, the
flattened cache), runs the graph once per step and samples.

Weights are read by `max_gpt2.model.checkpoint.Checkpoint`, the adapter `load_lm` uses:
both key layouts, Conv1D transposed, the head tied to `wte` unless the
checkpoint unties it, every shape checked against `config.json`, the same errors.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from max.driver import CPU
from max.pipelines.architectures.llama3_modulev3.batch_processor import Llama3ModuleV3BatchProcessor
from max.pipelines.context import TextContext
from max.pipelines.lib import ModuleV3PipelineModelWithKVCache

from max_gpt2.inference.devices import to_buffer
from max_gpt2.model.checkpoint import Checkpoint
from max_gpt2.serving.model_config import GPT2ServingConfig
from max_gpt2.serving.paged_gpt2 import PagedGPT2LMHeadModel


class GPT2PipelineModel(ModuleV3PipelineModelWithKVCache[TextContext]):
    """GPT-2 for MAX's text-generation pipeline, on MAX's paged KV cache."""

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
        module = PagedGPT2LMHeadModel(model_config.model, self.kv_params)
        module.to(self.devices[0])
        return module
