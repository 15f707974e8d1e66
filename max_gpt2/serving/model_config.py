"""What the serving pipeline needs to know about a GPT-2 checkpoint: its shapes, dtype and KV cache.

MAX builds this from the checkpoint's `config.json` (read by Hugging Face's
`AutoConfig`) and the pipeline's own settings (`--quantization-encoding`,
`--max-length`, the cache's page size). The model's shapes come through our own
`GPT2Config`, so a config we would refuse elsewhere is refused here too, with the
same message. How the projections and the LM head are stored (`max_gpt2.model.formats`:
float32, bfloat16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, or a GGUF file's own mix of
them) comes from our serving settings (`ServingSettings.weight_format`: `max-gpt2 serve
--weight-format`): MAX's command line has no option an architecture may add, and its
`--quantization-encoding` knows neither q8_0 nor bfloat16 on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from max.dtype import DType
from max.graph import DeviceRef
from max.nn.kv_cache import KVCacheParams
from max.pipelines.kv_cache import cache_dtype_for_encoding
from max.pipelines.lib import KVCacheConfig, MAXModelConfig, PipelineConfig
from max.pipelines.lib.interfaces.arch_config import ArchConfigWithKVCache, ArchConfigWithStoredKVParams
from max.pipelines.modeling.config_enums import SupportedEncoding, supported_encoding_dtype
from transformers import AutoConfig
from typing_extensions import Self

from max_gpt2.max_internals import served_encoding
from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint, open_checkpoint
from max_gpt2.model.checkpoints.lora import MergedCheckpoint, with_adapters
from max_gpt2.model.checkpoints.stored_weights import Stored
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32, FORMATS, WeightFormat, format_named
from max_gpt2.serving.settings import VARIABLE, ServingSettings


@dataclass(kw_only=True)
class GPT2ServingConfig(ArchConfigWithStoredKVParams, ArchConfigWithKVCache):
    """GPT-2's shapes (`model`), compute dtype, weight format and MAX's paged KV cache parameters."""

    # MAX serves float32 on CPU; bfloat16 is for GPUs.
    DEFAULT_ENCODING: ClassVar[SupportedEncoding] = "float32"
    SUPPORTED_ENCODINGS: ClassVar[set[SupportedEncoding]] = {"float32", "bfloat16"}

    model: GPT2Config
    dtype: DType
    kv_params: KVCacheParams
    max_seq_len: int
    devices: list[DeviceRef]
    weight_format: WeightFormat = FLOAT32

    @classmethod
    def construct_kv_params(
        cls,
        huggingface_config: AutoConfig,
        pipeline_config: PipelineConfig,
        devices: list[DeviceRef],
        kv_cache_config: KVCacheConfig,
        cache_dtype: DType,
        *,
        allow_kv_head_replication: bool = False,
    ) -> KVCacheParams:
        """One key and one value per head and layer (GPT-2 has no grouped-query attention); with prompt
        lookup, room for each request's drafted tokens (`max_gpt2.serving.drafts`)."""
        return kv_cache_config.to_params(
            dtype=cache_dtype,
            n_kv_heads=huggingface_config.n_head,
            head_dim=huggingface_config.n_embd // huggingface_config.n_head,
            num_layers=huggingface_config.n_layer,
            devices=devices,
            data_parallel_degree=pipeline_config.model.data_parallel_degree,
            allow_kv_head_replication=allow_kv_head_replication,
            num_draft_tokens=ServingSettings.from_environment().prompt_lookup,
        )

    @classmethod
    def initialize(
        cls, pipeline_config: PipelineConfig, model_config: MAXModelConfig | None = None, *, max_seq_len: int
    ) -> Self:
        model_config = model_config or pipeline_config.model
        huggingface_config = model_config.huggingface_config
        if huggingface_config is None:
            raise ValueError(f"no config.json could be read for {model_config.model_path}")
        encoding = served_encoding(model_config, cls.DEFAULT_ENCODING)
        devices = [DeviceRef(spec.device_type, spec.id) for spec in model_config.device_specs]
        cache_dtype = cache_dtype_for_encoding(encoding, model_config.kv_cache.kv_cache_format)
        return cls(
            model=GPT2Config.from_dict(huggingface_config.to_dict(), source=f"{model_config.model_path}"),
            dtype=supported_encoding_dtype(encoding),
            kv_params=cls.construct_kv_params(
                huggingface_config, pipeline_config, devices, model_config.kv_cache, cache_dtype
            ),
            max_seq_len=max_seq_len,
            devices=devices,
            weight_format=served_weight_format(lambda: open_checkpoint(served_checkpoint(model_config))),
        )


def served_checkpoint(model_config: MAXModelConfig) -> Path:
    """What MAX serves: a GGUF file given as its weight path, else the model directory."""
    gguf = (Path(file) for file in model_config.weight_path if Path(file).suffix == ".gguf")
    return next(gguf, Path(model_config.model_path))


def opened_served(model_config: MAXModelConfig) -> OpenedCheckpoint | MergedCheckpoint:
    """The served checkpoint, opened, with the adapters our serving settings name merged as it loads."""
    adapters = ServingSettings.from_environment().adapters()
    return with_adapters(open_checkpoint(served_checkpoint(model_config)), adapters)


def served_weight_format(checkpoint: Callable[[], Stored]) -> WeightFormat:
    """The weight format our serving settings name (float32 by default), or the served checkpoint's own
    mix of formats where they name that (`checkpoint` opens it); a ValueError lists ours."""
    name = ServingSettings.from_environment().weight_format
    if name not in FORMATS and (own := checkpoint().weight_format).name == name:
        return own
    return format_named(name, f"{VARIABLE}'s weight_format")
