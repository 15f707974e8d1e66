"""Devices, what runs on each, and moving NumPy arrays to and from them in a compute dtype.

Device names are what users type: `"cpu"`, `"gpu"`, `"gpu:N"` or `"auto"` (an
accelerator when MAX sees one). The Mojo decoding kernels run on the CPU in
float32 (`kernels_run_on`); `gpu_of` names an NVIDIA GPU for the refusals of
what MAX 26.7 cannot compile on it (`max_gpt2.model.gpu_limits`). The compute
dtypes are `DTYPES` (`parse_dtype`). NumPy has no bfloat16, so bfloat16 crosses the
boundary as float32 (rounded on the way in, widened on the way out);
`weight_buffers` turns a model's adapted weights into the buffers a compiled graph binds.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from max.driver import CPU, Accelerator, Buffer, Device, accelerator_count
from max.dtype import DType

from max_gpt2.model.checkpoints.stored_weights import StoredWeights, pack
from max_gpt2.model.formats import WeightFormat
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.gpu_limits import GPU

DTYPES = {"float32": DType.float32, "bfloat16": DType.bfloat16, "float16": DType.float16}
"""The compute dtypes, by the names users type."""

NUMPY_DTYPES = {DType.float32: np.float32, DType.float16: np.float16, DType.bfloat16: np.float32}
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


def parse_dtype(dtype: str | DType, argument: str = "dtype") -> DType:
    """A name of `DTYPES` (or the `DType` itself) to its `DType`; a ValueError naming `argument` else."""
    if isinstance(dtype, DType) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"{argument} must be one of {', '.join(DTYPES)}; got {dtype!r}")


def device_name(device: Device) -> str:
    """`"cpu"` or `"gpu:N"`, as `resolve_device` accepts it."""
    return "cpu" if device.is_host else f"gpu:{device.id}"


def kernels_run_on(device: Device, dtype: DType) -> bool:
    """Whether the Mojo decoding kernels (`max_gpt2.kernels`) serve `device` in `dtype`: the CPU, float32."""
    return device.is_host and dtype == DType.float32


def gpu_of(device: Device) -> GPU | None:
    """The NVIDIA GPU `device` is, as `max_gpt2.model.gpu_limits` names it; None for the host or another
    accelerator."""
    if device.is_host or device.api != "cuda":
        return None
    return GPU(device_name(device), device.architecture_name)


def to_buffer(values: np.ndarray, dtype: DType, device: Device) -> Buffer:
    """A NumPy array converted to `dtype` and placed on `device`."""
    if dtype == DType.bfloat16:
        buffer = Buffer.from_numpy(float32_to_bfloat16_bits(values)).view(DType.bfloat16)
    else:
        buffer = Buffer.from_numpy(np.ascontiguousarray(values, dtype=NUMPY_DTYPES[dtype]))
    return buffer if device.is_host else buffer.to(device)


def weight_buffers(
    weights: Mapping[str, np.ndarray], weight_format: WeightFormat, dtype: DType, device: Device | None = None
) -> dict[str, Buffer]:
    """The buffers a compiled GPT-2 binds for `weights` (float32, MAX layout: `Checkpoint.model_weights()`,
    or `StoredWeights` already in `weight_format`'s layout), on `device` (None: the host).

    The projections and the LM head are packed into `weight_format` and kept as stored
    (`max_gpt2.model.checkpoints.stored_weights`); every other array is converted to the compute `dtype`, and
    bound without a copy where it is float32 on the host already. An array bound under several
    names (a tied LM head is `wte`'s array) is converted once and bound as one buffer.
    """
    device = CPU() if device is None else device
    stored = weights if isinstance(weights, StoredWeights) else pack(weights, weight_format)
    converted: dict[int, Buffer] = {}
    for name, array in stored.items():
        if id(array) in converted:
            continue
        if weight_format.binds_own_dtype(name):
            buffer = packed_buffer(array)
            converted[id(array)] = buffer if device.is_host else buffer.to(device)
        else:
            converted[id(array)] = to_buffer(array, dtype, device)
    return {name: converted[id(array)] for name, array in stored.items()}


def packed_buffer(values: np.ndarray) -> Buffer:
    """A packed weight as stored (`max_gpt2.model.formats`) on the host: int8, uint8 and
    float16 as they are, bfloat16 from its uint16 bit patterns."""
    buffer = Buffer.from_numpy(np.ascontiguousarray(values))
    return buffer.view(DType.bfloat16) if values.dtype == np.uint16 else buffer


def host_array(buffer: Buffer) -> np.ndarray:
    """A host buffer's elements as NumPy, bfloat16 as its uint16 bit patterns."""
    if buffer.dtype == DType.bfloat16:
        return np.from_dlpack(buffer.view(DType.uint16))
    return np.from_dlpack(buffer)


def host_buffer(values: np.ndarray, dtype: DType) -> Buffer:
    """Inverse of `host_array`."""
    return Buffer.from_numpy(np.ascontiguousarray(values)).view(dtype)


def to_numpy(buffer: Buffer) -> np.ndarray:
    """A result buffer read back into NumPy (bfloat16 widened to float32)."""
    host = host_array(buffer if buffer.device.is_host else buffer.to(CPU()))
    return bfloat16_bits_to_float32(host) if buffer.dtype == DType.bfloat16 else host
