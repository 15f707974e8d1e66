"""Tracing the language model's graph variants (`max_gpt2.inference.lm_graphs`): the one place that
builds them, and so the one that imports MAX's graph-building modules.

Every variant takes the same inputs, every length symbolic: input ids and position ids
`[batch, seq]` int64, the attention mask `[batch, total]` int64, the positions whose logits are
wanted `[logits]` int64, and one KV cache buffer per layer `[2, batch, n_head, max_len, head_dim]`.
The "reorder" graph (beam search, CPU only) takes rows and kept `[batch]` int64, the cache's mask
`[batch, total]` int64 and the caches: row b of each takes row rows[b]'s positions from kept[b] on,
in place.
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import TensorType, default_device, default_dtype
from max.graph import BufferType, DeviceRef, Graph
from max.graph import TensorType as GraphTensorType

from max_gpt2.inference.lm_options import LMOptions
from max_gpt2.kernels import kernel_library, reorder_rows
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.layers.gpt2 import GPT2LMHeadModel
from max_gpt2.model.layers.variants import CacheReorder, Variant


def trace_lm(config: GPT2Config, options: LMOptions, variant: Variant | CacheReorder) -> Graph:
    """The graph of `variant` (`max_gpt2.model.layers.variants`) for `config` and `options`."""
    if isinstance(variant, CacheReorder):
        return reorder_graph(config, options)
    device = options.device
    with F.lazy(), default_device(device), default_dtype(options.dtype):  # no initial weights made
        module = GPT2LMHeadModel(config, variant, options.weight_format)
    tokens = TensorType(DType.int64, ["batch", "seq"], device=device)
    mask = TensorType(DType.int64, ["batch", "total"], device=device)
    logit_index = TensorType(DType.int64, ["logits"], device=device)
    inputs = [tokens, tokens, mask, logit_index, *[cache_type(config, options)] * config.n_layer]
    return module.trace(*inputs, name=f"GPT2LMHeadModel_{variant.name}").graph


def cache_type(config: GPT2Config, options: LMOptions) -> BufferType:
    """One layer's KV cache `[2, batch, n_head, max_len, head_dim]`, written in place."""
    shape = [2, "batch", config.n_head, "max_len", config.head_dim]
    return BufferType(options.kv_dtype, shape, DeviceRef.from_device(options.device))


def reorder_graph(config: GPT2Config, options: LMOptions) -> Graph:
    """Beam search's cache reorder: every layer's rows copied from their parents in place
    (`gpt2_reorder_rows`, a CPU kernel)."""
    if not options.device.is_host:
        raise ValueError("beam search (num_beams > 1) runs on the CPU: its cache reorder is a CPU kernel")
    device_ref = DeviceRef.from_device(options.device)
    rows = GraphTensorType(DType.int64, ["batch"], device_ref)
    mask = GraphTensorType(DType.int64, ["batch", "total"], device_ref)
    inputs = [rows, rows, mask, *[cache_type(config, options)] * config.n_layer]
    with Graph("GPT2LMHeadModel_reorder", input_types=inputs, custom_extensions=[kernel_library()]) as graph:
        order, kept, written, *caches = graph.inputs
        for cache in caches:
            reorder_rows(cache.buffer, order.tensor, kept.tensor, written.tensor)
        graph.output()
    return graph
