"""Compiling `GPT2Attention` into a MAX graph and running it from NumPy, MAX or DLPack.

One compile serves every batch size and sequence length: the graph's input is
`[batch, seq, n_embd]` with `batch` and `seq` symbolic. Weights are bound
after compiling, so `CompiledAttention.with_weights` runs another layer on the
same compiled graph in milliseconds instead of compiling again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import CPU, Accelerator, Buffer, Device, accelerator_count
from max.dtype import DType
from max.engine import CompiledModel, InferenceSession
from max.experimental import functional as F
from max.experimental.tensor import Tensor, TensorType, default_device, default_dtype

from max_gpt2.attention import GPT2Attention
from max_gpt2.config import GPT2Config
from max_gpt2.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits, parse_dtype
from max_gpt2.weights import Checkpoint, check_weights

_NUMPY_DTYPES = {DType.float32: np.float32, DType.float16: np.float16, DType.bfloat16: np.float32}
"""What a NumPy caller gets back for each compute dtype (NumPy has no bfloat16)."""


def resolve_device(device: str | Device = "auto") -> Device:
    """`"cpu"`, `"gpu"`, `"gpu:N"` or `"auto"` (an accelerator when MAX sees one) to a MAX device."""
    if isinstance(device, Device):
        return device
    count = accelerator_count()
    if device == "auto":
        return Accelerator() if count else CPU()
    if device == "cpu":
        return CPU()
    kind, _, index = str(device).partition(":")
    if kind == "gpu" and (index == "" or index.isdigit()):
        ordinal = int(index or 0)
        if ordinal >= count:
            raise ValueError(f"device {device!r} asked for, but MAX sees {count} accelerator(s)")
        return Accelerator(ordinal)
    raise ValueError(f"device must be 'auto', 'cpu', 'gpu' or 'gpu:N'; got {device!r}")


def device_name(device: Device) -> str:
    """`"cpu"` or `"gpu:N"`, as `resolve_device` accepts it."""
    return "cpu" if device.is_host else f"gpu:{device.id}"


def _to_buffer(values: np.ndarray, dtype: DType, device: Device) -> Buffer:
    """A NumPy array converted to `dtype` and placed on `device`."""
    if dtype == DType.bfloat16:
        buffer = Buffer.from_numpy(float32_to_bfloat16_bits(values)).view(DType.bfloat16)
    else:
        buffer = Buffer.from_numpy(np.ascontiguousarray(values, dtype=_NUMPY_DTYPES[dtype]))
    return buffer if device.is_host else buffer.to(device)


def _to_numpy(buffer: Buffer) -> np.ndarray:
    """A result buffer read back into NumPy (bfloat16 widened to float32)."""
    host = buffer if buffer.device.is_host else buffer.to(CPU())
    if host.dtype == DType.bfloat16:
        return bfloat16_bits_to_float32(np.from_dlpack(host.view(DType.uint16)))
    return np.from_dlpack(host)


class CompiledAttention:
    """GPT-2 attention compiled for one device and dtype, with one layer's weights bound.

    Call it with `x` `[batch, seq, n_embd]`. A NumPy array of any float dtype is
    converted at the boundary and the result comes back as NumPy, in the
    compute dtype (float32 for bfloat16). A MAX `Tensor`, `Buffer` or any
    DLPack array must already have the compute dtype; it is moved to the device
    if needed, and the result is a MAX `Tensor` on the device.
    """

    def __init__(
        self,
        config: GPT2Config,
        device: Device,
        dtype: DType,
        session: InferenceSession,
        compiled: CompiledModel,
        weights: Mapping[str, np.ndarray],
    ) -> None:
        """Binds `weights` (already checked by `check_weights`) to the compiled graph."""
        self.config, self.device, self.dtype = config, device, dtype
        self._session, self._compiled = session, compiled
        # The registry must outlive the model that reads it, so it is kept here.
        self._weights = {name: _to_buffer(array, dtype, CPU()) for name, array in weights.items()}
        self._model = session.init(compiled, weights_registry=self._weights)

    def with_weights(self, weights: Mapping[str, np.ndarray]) -> CompiledAttention:
        """The same compiled graph with other weights bound (another layer, say); no recompile."""
        checked = check_weights(weights, self.config)
        return CompiledAttention(self.config, self.device, self.dtype, self._session, self._compiled, checked)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"CompiledAttention(n_embd={c.n_embd}, n_head={c.n_head}, "
            f"device={device_name(self.device)!r}, dtype={self.dtype.name!r})"
        )

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
            return np.zeros(x.shape, dtype=_NUMPY_DTYPES[self.dtype])
        (result,) = self._model.execute(_to_buffer(x, self.dtype, self.device))
        return _to_numpy(result)

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
        (result,) = self._model.execute(buffer)
        return Tensor.from_dlpack(result)


def compile_attention(
    config: GPT2Config,
    weights: Mapping[str, np.ndarray],
    device: str | Device = "auto",
    dtype: str | DType = "float32",
) -> CompiledAttention:
    """Compiles GPT-2 attention for `device` and `dtype` and binds `weights`.

    `weights` holds `c_attn.weight`, `c_attn.bias`, `c_proj.weight` and
    `c_proj.bias` in MAX `Linear` layout, as `load_attention_weights` returns
    them. The graph has symbolic batch and sequence dimensions, so this one
    compile serves every input shape.
    """
    target, compute_dtype = resolve_device(device), parse_dtype(dtype)
    checked = check_weights(weights, config)  # before spending time compiling
    with F.lazy(), default_device(target), default_dtype(compute_dtype):
        module = GPT2Attention(config)  # lazy: its random initial weights are never made
    staged = module.trace(TensorType(compute_dtype, ("batch", "seq", config.n_embd), device=target))
    session = InferenceSession(devices=[target])
    compiled = session.compile(staged.graph)
    return CompiledAttention(config, target, compute_dtype, session, compiled, checked)


def from_pretrained(
    checkpoint: str | Path,
    layer: int = 0,
    device: str | Device = "auto",
    dtype: str | DType = "float32",
) -> CompiledAttention:
    """Reads `layer` of a GPT-2 safetensors checkpoint and compiles its attention."""
    opened = Checkpoint(checkpoint)
    return compile_attention(opened.config, opened.attention_weights(layer), device, dtype)
