"""Compiling GPT-2 attention into a MAX graph and running it from NumPy, MAX or DLPack.

One compile serves every batch size and sequence length: the graph's input is
`[batch, seq, n_embd]` with `batch` and `seq` symbolic (`[batch, T, seq / T,
n_embd]` for the tiled CPU flash graph, padded and reshaped here). Weights are
bound after compiling, so `CompiledAttention.with_weights` runs another layer
on the same compiled graph in milliseconds instead of compiling again.

Implementations (`impl`), all computing the same function from the same weights:

- `graph`: `GPT2Attention`, the explicit formulation (scores, mask, softmax).
- `flash`: causal attention that skips the masked half (`max_gpt2.model.layers.flash`):
  MAX's flash-attention kernel on GPU, a tiled graph on CPU.
- `wrapper`: one head at a time (`max_gpt2.model.layers.wrapper`), the tutorials'
  starting point, kept as a benchmark baseline.
- `auto`: the fastest measured for the device and dtype (see `resolve_impl`).

`CompiledAttention.attentions(x)` returns the weights each head gave each key,
from the `graph` formulation compiled with `output_attentions=True` the first
time it is called (`max_gpt2.inference.compiled`): calling the attention never pays for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import Buffer, Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor, TensorType, default_device, default_dtype
from max.graph import Graph

from max_gpt2.inference.compiled import CompiledModel, GraphVariants
from max_gpt2.inference.devices import (
    NUMPY_DTYPES,
    gpu_of,
    host_array,
    host_buffer,
    parse_dtype,
    resolve_device,
    to_buffer,
    to_numpy,
)
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.model.checkpoints.weight_adapters import check_weights
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.gpu_limits import check_attention_weights, check_compiles
from max_gpt2.model.layers.attention import GPT2Attention
from max_gpt2.model.layers.flash import KernelFlashAttention, TiledCausalAttention
from max_gpt2.model.layers.variants import ATTENTIONS, PLAIN, Head, Variant
from max_gpt2.model.layers.wrapper import PerHeadWrapperAttention

IMPLEMENTATIONS = ("auto", "graph", "flash", "wrapper")

CPU_FLASH_TILES = 4
"""Sequence tiles of the CPU flash graph: the fastest of 2, 4 and 8 at GPT-2 small, 1 x 1024 tokens
(docs/performance.md); every tile adds a few dozen small ops, which is what makes more tiles slower
at short lengths."""


def resolve_impl(impl: str, device: Device, dtype: DType) -> str:
    """`impl` as asked, or for `"auto"` the implementation measured fastest on `device` in `dtype`.

    GPU, bfloat16 and float16: `flash` (MAX's fused kernel). GPU float32 and
    every CPU dtype: `graph`. On CPU the tiled `flash` graph wins only on long
    sequences (past about 512 tokens for GPT-2 small) and loses at short ones,
    where its extra ops cost more than the masked half it skips (docs/performance.md).
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLEMENTATIONS))}; got {impl!r}")
    if impl != "auto":
        return impl
    fused_kernel = not device.is_host and dtype in (DType.bfloat16, DType.float16)
    return "flash" if fused_kernel else "graph"


def _pad_to_tiles(x: np.ndarray, tiles: int) -> np.ndarray:
    """[B, S, D] -> [B, tiles, ceil(S / tiles), D], zero tokens appended (the future of every query)."""
    batch, seq_len, width = x.shape
    padding = -seq_len % tiles
    if padding:
        x = np.concatenate([x, np.zeros((batch, padding, width), dtype=x.dtype)], axis=1)
    return x.reshape(batch, tiles, -1, width)


def _untile(y: np.ndarray, seq_len: int) -> np.ndarray:
    """[B, tiles, t, D] -> [B, seq_len, D], the padding dropped."""
    batch, _, _, width = y.shape
    return y.reshape(batch, -1, width)[:, :seq_len]


class AttentionGraphs(GraphVariants):
    """One attention's graph variants: the `impl` graph, and the `graph` one that outputs weights."""

    def __init__(self, config: GPT2Config, device: Device, dtype: DType, impl: str) -> None:
        super().__init__(device, self._trace)
        self.config, self.device, self.dtype, self.impl = config, device, dtype, impl
        # > 1: the graph takes x as [batch, tiles, seq / tiles, n_embd]
        self.tiles = CPU_FLASH_TILES if impl == "flash" and device.is_host else 1

    def _trace(self, variant: Variant) -> Graph:
        config, tiles = self.config, self.tiles
        output_attentions = variant.head is Head.ATTENTIONS
        with F.lazy(), default_device(self.device), default_dtype(self.dtype):
            # lazy: the modules' random initial weights are never made
            if output_attentions:
                module = GPT2Attention(config, output_attentions=True)
            elif self.impl == "wrapper":
                module = PerHeadWrapperAttention(config)
            elif self.impl == "flash":
                module = TiledCausalAttention(config, tiles) if tiles > 1 else KernelFlashAttention(config)
            else:
                module = GPT2Attention(config)
        sequence = (tiles, "tile") if tiles > 1 and not output_attentions else ("seq",)
        x = TensorType(self.dtype, ("batch", *sequence, config.n_embd), device=self.device)
        return module.trace(x).graph


class CompiledAttention(CompiledModel):
    """GPT-2 attention compiled for one device and dtype, with one layer's weights bound.

    Call it with `x` `[batch, seq, n_embd]`. A NumPy array of any float dtype is
    converted at the boundary and the result comes back as NumPy, in the
    compute dtype (float32 for bfloat16). A MAX `Tensor`, `Buffer` or any
    DLPack array must already have the compute dtype; it is moved to the device
    if needed, and the result is a MAX `Tensor` on the device.
    """

    graph: AttentionGraphs
    check_weights = staticmethod(check_weights)

    @property
    def impl(self) -> str:
        """The implementation compiled: `"graph"`, `"flash"` or `"wrapper"`."""
        return self.graph.impl

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {"n_embd": c.n_embd, "n_head": c.n_head, **self.placement(), "impl": self.impl}

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 3 or shape[-1] != self.config.n_embd:
            raise ValueError(
                f"x must have shape [batch, seq, n_embd={self.config.n_embd}]; got {list(shape)}"
            )

    def __call__(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return self._run_numpy(x)
        if not hasattr(x, "__dlpack__"):
            raise TypeError(
                f"x must be a NumPy array, a MAX Tensor or a DLPack array; got {type(x).__name__}"
            )
        return self._run_dlpack(x)

    def _run_numpy(self, x: np.ndarray) -> np.ndarray:
        self._check_shape(x.shape)
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"x must hold floating-point values; got dtype {x.dtype}")
        if x.size == 0:  # nothing to attend over; skip the device round trip
            return np.zeros(x.shape, dtype=NUMPY_DTYPES[self.dtype])
        return to_numpy(self._execute(to_buffer(x, self.dtype, self.device)))

    def _run_dlpack(self, x: Any) -> Tensor:
        buffer = Buffer.from_dlpack(x)
        self._check_shape(tuple(buffer.shape))
        if buffer.dtype != self.dtype:
            raise TypeError(
                f"x has dtype {buffer.dtype.name} but this graph computes in {self.dtype.name}; "
                f"cast it first, or pass a NumPy array (converted automatically)"
            )
        if buffer.num_elements == 0:
            return Tensor.from_dlpack(Buffer.zeros(tuple(buffer.shape), self.dtype, self.device))
        if buffer.device != self.device:
            buffer = buffer.to(self.device)
        return Tensor.from_dlpack(self._execute(buffer))

    def _execute(self, x: Buffer) -> Buffer:
        """Runs the graph on `x` [batch, seq, n_embd], already on the device in the compute dtype."""
        tiles = self.graph.tiles
        if tiles == 1:
            (result,) = self._bound.execute(PLAIN, x)
            return result
        # Only CPU graphs are tiled, so padding and reshaping happen in host memory.
        (result,) = self._bound.execute(PLAIN, host_buffer(_pad_to_tiles(host_array(x), tiles), self.dtype))
        return host_buffer(_untile(host_array(result), x.shape[1]), self.dtype)

    def attentions(self, x: np.ndarray) -> np.ndarray:
        """The weights every head gives every key, float32 `[batch, n_head, seq, seq]`.

        `x` is a NumPy array `[batch, seq, n_embd]`. Row i of a head holds the
        softmax over keys 0..i: it sums to 1, and the future keys get exactly 0.
        The first call compiles the graph that outputs them (a minute or two
        on a small CPU; MAX caches it on disk, so the next process takes seconds).
        Refused in bfloat16 on NVIDIA Hopper, where MAX 26.7 gets them wrong
        (`gpu_limits.hopper_attention_weights_refusal`).
        """
        check_attention_weights(gpu_of(self.device), self.dtype)
        if not isinstance(x, np.ndarray):
            raise TypeError(f"x must be a NumPy array; got {type(x).__name__}")
        self._check_shape(x.shape)
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"x must hold floating-point values; got dtype {x.dtype}")
        batch, seq_len, _ = x.shape
        if x.size == 0:
            return np.zeros((batch, self.config.n_head, seq_len, seq_len), dtype=np.float32)
        _, weights = self._bound.execute(ATTENTIONS, to_buffer(x, self.dtype, self.device))
        return to_numpy(weights).astype(np.float32)


def compile_attention(
    config: GPT2Config,
    weights: Mapping[str, np.ndarray],
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    impl: str = "auto",
) -> CompiledAttention:
    """Compiles GPT-2 attention for `device`, `dtype` and `impl` and binds `weights`.

    `weights` holds `c_attn.weight`, `c_attn.bias`, `c_proj.weight` and
    `c_proj.bias` in MAX `Linear` layout, as `load_attention_weights` returns
    them. `impl` is one of `IMPLEMENTATIONS` (module docstring). The graph has
    symbolic batch and sequence dimensions, so this one compile serves every
    input shape. What MAX cannot compile on the device (`gpu_limits.hopper_refusal`)
    is refused before compiling.
    """
    target, compute_dtype = resolve_device(device), parse_dtype(dtype)
    check_compiles(gpu_of(target), compute_dtype, config.n_embd)
    chosen = resolve_impl(impl, target, compute_dtype)
    checked = check_weights(weights, config)  # before spending time compiling
    graph = AttentionGraphs(config, target, compute_dtype, chosen)
    graph.compile(PLAIN)  # the attention-weights variant waits until `attentions` is called
    return CompiledAttention(config, target, compute_dtype, graph, checked)


def from_pretrained(
    checkpoint: str | Path,
    layer: int = 0,
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    impl: str = "auto",
) -> CompiledAttention:
    """Reads `layer` of a GPT-2 safetensors checkpoint and compiles its attention."""
    opened = Checkpoint(checkpoint)
    return compile_attention(opened.config, opened.attention_weights(layer), device, dtype, impl)
