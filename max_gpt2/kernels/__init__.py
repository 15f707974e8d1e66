"""Mojo kernels for decoding on the CPU, and the MAX modules that call them.

A decoding step computes one new token per row, so it reads every weight and
the whole KV cache to do a few multiply-adds with each value: its speed is
memory bandwidth. Two custom ops, written in Mojo beside this file, do the
step's heavy parts in one pass over memory each (float32, CPU):

    skinny_matmul          x [M, K] @ W[N, K]^T -> [M, N]; each row of W is read once
                           for all M rows of x (M is batch x new tokens, a few at most)
    gpt2_cached_attention  qkv [B, S, 3D], cache [2, B, H, M, d], key_bias [B, T]
                           -> [B, S, D]: writes the S new keys and values at
                           T - S..T-1, then each query attends over the cache up
                           to its own position, heads merged

`SkinnyLinear` and `KernelCachedAttention` put them behind the same modules and
parameter names as `Linear` and `CachedAttention`. MAX compiles the Mojo package
(this directory) with the graph that uses it, a few seconds, cached with the graph.
The kernels fit few new tokens; the prompt runs through MAX's own ops.
"""

from __future__ import annotations

from pathlib import Path

from max.driver import Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Linear
from max.experimental.tensor import Tensor, TensorType
from max.graph import BufferValue, DeviceRef, Graph, ops

from max_gpt2.cached_attention import CachedAttention

MOJO_PACKAGE = Path(__file__).parent


def kernels_run_on(device: Device, dtype: DType) -> bool:
    """Whether the decoding kernels serve this device and dtype: the CPU, float32."""
    return device.is_host and dtype == DType.float32


def skinny_matmul_graph() -> Graph:
    """`skinny_matmul` alone, for the CPU: x [M, K] and W [N, K] in, y [M, N] out (all symbolic)."""
    cpu = DeviceRef.CPU()
    x, w = (TensorType(DType.float32, shape, cpu) for shape in (["M", "K"], ["N", "K"]))
    with Graph("skinny_matmul_alone", input_types=[x, w], custom_extensions=[MOJO_PACKAGE]) as graph:
        x, w = (value.tensor for value in graph.inputs)
        out = TensorType(DType.float32, [x.shape[0], w.shape[0]], cpu)
        graph.output(*ops.custom("skinny_matmul", cpu, [x, w], [out]))
    return graph


class SkinnyLinear(Linear):
    """`Linear` (same parameters) through `skinny_matmul`: for inputs of a few rows."""

    def forward(self, x: Tensor) -> Tensor:
        """[..., in] -> [..., out]."""
        out_dim, in_dim = self.weight.shape
        rows = x.reshape([-1, in_dim])  # [M, K]
        out_type = TensorType(x.dtype, [rows.shape[0], out_dim], device=x.device)
        (y,) = F.custom(
            "skinny_matmul", x.device, [rows, self.weight], [out_type], custom_extensions=MOJO_PACKAGE
        )
        return (y + self.bias).reshape([*x.shape[:-1], out_dim])


class KernelCachedAttention(CachedAttention):
    """`CachedAttention` (same parameters) through `gpt2_cached_attention`; no attention weights out."""

    def forward(self, x: Tensor, cache: Tensor, key_bias: Tensor) -> Tensor:  # type: ignore[override]
        """`x` [B, S, D], `cache` buffer [2, B, H, M, d], `key_bias` [B, 1, 1, T] -> [B, S, D]."""
        batch, total = key_bias.shape[0], key_bias.shape[-1]
        out_type = TensorType(x.dtype, x.shape, device=x.device)
        (attended,) = F.inplace_custom(
            "gpt2_cached_attention",
            x.device,
            [BufferValue(cache), self.c_attn(x), key_bias.reshape([batch, total])],
            [out_type],
            custom_extensions=MOJO_PACKAGE,
        )
        return self.c_proj(attended)
