"""Tracing the language model's graph variants (`max_gpt2.inference.lm_graphs`): the one place that
builds them, and so the one that imports MAX's graph-building modules.

Every variant takes the same inputs, every length symbolic: input ids and position ids
`[batch, seq]` int64, the attention mask `[batch, total]` int64, the positions whose logits are
wanted `[logits]` int64, and one KV cache buffer per layer `[2, batch, n_head, max_len, head_dim]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import TensorType, default_device, default_dtype
from max.graph import BufferType, DeviceRef, Graph

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.gpt2 import GPT2LMHeadModel

if TYPE_CHECKING:
    from max_gpt2.inference.lm_graphs import LMOptions


def trace_lm(config: GPT2Config, options: LMOptions, variant: str) -> Graph:
    """The graph of `variant` ("plain", "decode" or "attentions") for `config` and `options`."""
    device = options.device
    with F.lazy(), default_device(device), default_dtype(options.dtype):
        # lazy: random initial weights are never made
        module = GPT2LMHeadModel(
            config,
            variant == "attentions",
            kernels=variant == "decode",
            weight_format=options.weight_format,
        )
    tokens = TensorType(DType.int64, ["batch", "seq"], device=device)
    mask = TensorType(DType.int64, ["batch", "total"], device=device)
    logit_index = TensorType(DType.int64, ["logits"], device=device)
    cache = BufferType(
        options.kv_dtype,
        [2, "batch", config.n_head, "max_len", config.head_dim],
        DeviceRef.from_device(device),
    )
    inputs = [tokens, tokens, mask, logit_index, *[cache] * config.n_layer]
    return module.trace(*inputs, name=f"GPT2LMHeadModel_{variant}").graph
