"""GPT-2 registered with MAX's pipelines under Hugging Face's architecture name, `GPT2LMHeadModel`: for
generating text, and for embeddings (MAX's `--task embeddings_generation`, `max-gpt2 serve --embeddings`)."""

from __future__ import annotations

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.llama3_modulev3.batch_processor import Llama3ModuleV3BatchProcessor
from max.pipelines.lib import SupportedArchitecture
from max.pipelines.modeling.types import PipelineTask

from max_gpt2.serving import weight_adapters
from max_gpt2.serving.context import GPT2Context
from max_gpt2.serving.embeddings_model import GPT2EmbeddingsModel
from max_gpt2.serving.memory_planner import GPT2MemoryPlanner
from max_gpt2.serving.model import GPT2PipelineModel
from max_gpt2.serving.model_config import GPT2ServingConfig
from max_gpt2.serving.pipeline import GPT2TextGenerationPipeline
from max_gpt2.serving.tokenizer import GPT2EmbeddingsTokenizer, GPT2TextTokenizer

gpt2_arch = SupportedArchitecture(
    name="GPT2LMHeadModel",
    example_repo_ids=["openai-community/gpt2", "openai-community/gpt2-medium"],
    default_encoding=GPT2ServingConfig.DEFAULT_ENCODING,
    supported_encodings=GPT2ServingConfig.SUPPORTED_ENCODINGS,
    pipeline_model=GPT2PipelineModel,
    pipeline_cls=GPT2TextGenerationPipeline,
    tokenizer=GPT2TextTokenizer,
    context_type=GPT2Context,  # MAX's, with `logit_bias`
    default_weights_format=WeightsFormat.safetensors,
    weight_adapters={
        WeightsFormat.safetensors: weight_adapters.stored_state_dict,
        WeightsFormat.gguf: weight_adapters.stored_state_dict,
    },
    task=PipelineTask.TEXT_GENERATION,
    config=GPT2ServingConfig,
    batching=Llama3ModuleV3BatchProcessor,
    memory_planner=GPT2MemoryPlanner,
    supports_overlap_scheduler=False,
    supports_device_graph_capture=False,
)

# MAX's embeddings pipeline with the library's LM (`max_gpt2.serving.embeddings_model`): no KV cache,
# no batch processor, no memory plan of ours.
gpt2_embeddings_arch = SupportedArchitecture(
    name="GPT2LMHeadModel",
    example_repo_ids=gpt2_arch.example_repo_ids,
    default_encoding=GPT2ServingConfig.DEFAULT_ENCODING,
    supported_encodings=GPT2ServingConfig.SUPPORTED_ENCODINGS,
    pipeline_model=GPT2EmbeddingsModel,  # type: ignore[arg-type]  # MAX calls two of PipelineModel's methods
    tokenizer=GPT2EmbeddingsTokenizer,
    context_type=GPT2Context,
    default_weights_format=WeightsFormat.safetensors,
    weight_adapters=gpt2_arch.weight_adapters,
    task=PipelineTask.EMBEDDINGS_GENERATION,
    config=GPT2ServingConfig,
)
