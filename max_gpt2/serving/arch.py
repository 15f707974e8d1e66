"""GPT-2 registered with MAX's pipelines under Hugging Face's architecture name, `GPT2LMHeadModel`."""

from __future__ import annotations

from typing import Any

from max.driver import Device
from max.graph.weights import WeightsFormat
from max.pipelines.architectures.llama3_modulev3.batch_processor import Llama3ModuleV3BatchProcessor
from max.pipelines.context import TextContext
from max.pipelines.kv_cache.memory_planner import PagedMemoryPlanner
from max.pipelines.lib import SupportedArchitecture
from max.pipelines.modeling.types import PipelineTask

from max_gpt2.serving.model import GPT2PipelineModel
from max_gpt2.serving.model_config import GPT2ServingConfig
from max_gpt2.serving.pipeline import GPT2TextGenerationPipeline
from max_gpt2.serving.tokenizer import GPT2TextTokenizer

CPU_BATCH_SIZE = 16  # requests decoded together on a CPU; see GPT2MemoryPlanner


class GPT2MemoryPlanner(PagedMemoryPlanner):
    """MAX's paged-cache planner, with a batch of several requests on a CPU.

    Left to itself MAX serves one request at a time on a CPU (its default for a
    single host device), so every other client waits for a whole generation. A
    decoding step reads every weight once whatever its batch, so requests decoded
    together share that cost: on a 2-core CPU GPT-2 small decodes about 5 x the
    tokens/s at batch 8 as at batch 1, and batch 16 still gains. `--max-batch-size`
    overrides this; other devices keep MAX's default.
    """

    def infer_max_batch_size(
        self, pipeline_config: Any, devices: list[Device], weights_size: int
    ) -> int | None:
        return CPU_BATCH_SIZE if all(device.is_host for device in devices) else None


gpt2_arch = SupportedArchitecture(
    name="GPT2LMHeadModel",
    example_repo_ids=["openai-community/gpt2", "openai-community/gpt2-medium"],
    default_encoding=GPT2ServingConfig.DEFAULT_ENCODING,
    supported_encodings=GPT2ServingConfig.SUPPORTED_ENCODINGS,
    pipeline_model=GPT2PipelineModel,
    pipeline_cls=GPT2TextGenerationPipeline,
    tokenizer=GPT2TextTokenizer,
    context_type=TextContext,
    default_weights_format=WeightsFormat.safetensors,
    task=PipelineTask.TEXT_GENERATION,
    config=GPT2ServingConfig,
    batching=Llama3ModuleV3BatchProcessor,
    memory_planner=GPT2MemoryPlanner,
    supports_overlap_scheduler=False,
    supports_device_graph_capture=False,
)
