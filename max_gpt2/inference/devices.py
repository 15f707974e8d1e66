"""Devices, what runs on each, and moving NumPy arrays to and from them in a compute dtype.

Device names are what users type: `"cpu"`, `"gpu"`, `"gpu:N"` or `"auto"` (an
accelerator when MAX sees one). The Mojo decoding kernels run on the CPU in
float32 (`kernels_run_on`); what MAX 26.7 cannot compile, or computes wrong, on
NVIDIA Hopper is refused before compiling (`check_compiles_on`,
`check_attention_weights_on`). NumPy has no bfloat16, so bfloat16 crosses the
boundary as float32 (rounded on the way in, widened on the way out);
`weight_buffers` turns a model's adapted weights into the buffers a compiled graph binds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from max.driver import CPU, Accelerator, Buffer, Device, accelerator_count
from max.dtype import DType

from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.stored_weights import StoredWeights, pack
from max_gpt2.model.weight_formats import WeightFormat, is_stored_packed

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


def device_name(device: Device) -> str:
    """`"cpu"` or `"gpu:N"`, as `resolve_device` accepts it."""
    return "cpu" if device.is_host else f"gpu:{device.id}"


def kernels_run_on(device: Device, dtype: DType) -> bool:
    """Whether the Mojo decoding kernels (`max_gpt2.kernels`) serve `device` in `dtype`: the CPU, float32."""
    return device.is_host and dtype == DType.float32


def hopper_refusal(architecture: str, dtype: DType, n_embd: int) -> str | None:
    """Why MAX 26.7 cannot compile GPT-2 of width `n_embd` in `dtype` on an NVIDIA GPU of
    `architecture` (`Device.architecture_name`), or None where it can.

    Measured on an H200 (`tests/test_gpu.py`): on Hopper (sm_90) float16 attention fails to
    compile, graph and flash alike (a constraint in MAX's sm_90 attention kernel's tensor-core
    MMA), and bfloat16 matmuls fail where a row of `n_embd` values is not a whole number of 16
    bytes (MAX's sm_90 tile loader: widths 40, 56, 64, 72, 768 and 1600 compile, 60 does not).
    """
    if not architecture.startswith("sm_90"):
        return None
    if dtype == DType.float16:
        return "float16 attention does not compile on NVIDIA Hopper (sm_90) in MAX 26.7; use bfloat16"
    if dtype == DType.bfloat16 and n_embd % 8:
        return (
            f"bfloat16 on NVIDIA Hopper (sm_90) needs n_embd divisible by 8 in MAX 26.7 (its matmul "
            f"loads rows in 16-byte tiles); got n_embd={n_embd}"
        )
    return None


def hopper_attention_weights_refusal(architecture: str, dtype: DType) -> str | None:
    """Why MAX 26.7 returns wrong attention weights (the `"attentions"` graph variant) in `dtype`
    on an NVIDIA GPU of `architecture`, or None where they were found right or never checked.

    Found on an H200 (`tests/test_gpu.py`): in bfloat16 the weights from MAX's softmax lack
    the causal mask (each row spreads over every key, later ones included; written out as
    exp / sum they keep it), and in every form tried the first one to three runs in a process
    return some layers' weights as zeros (waiting for the device before or after reading
    changes nothing). The float32 weights there match the reference from the first run, and
    the bfloat16 logits are right.
    """
    if architecture.startswith("sm_90") and dtype == DType.bfloat16:
        return (
            "attention weights in bfloat16 on NVIDIA Hopper (sm_90) come out wrong in MAX 26.7 "
            "(the causal mask is lost and early runs return zeros); use dtype='float32'"
        )
    return None


def check_attention_weights_on(device: Device, dtype: DType) -> None:
    """Refuses, before compiling the attention-weights variant, what `hopper_attention_weights_refusal`
    names."""
    _refuse_on(device, lambda architecture: hopper_attention_weights_refusal(architecture, dtype))


def check_compiles_on(device: Device, dtype: DType, n_embd: int) -> None:
    """Refuses, before a compile that would fail minutes later, what `hopper_refusal` names."""
    _refuse_on(device, lambda architecture: hopper_refusal(architecture, dtype, n_embd))


def _refuse_on(device: Device, refusal: Callable[[str], str | None]) -> None:
    """Raises ValueError, naming the device, where `refusal(architecture)` of an NVIDIA GPU gives a reason."""
    if device.is_host or device.api != "cuda":
        return
    reason = refusal(device.architecture_name)
    if reason:
        raise ValueError(f"{device_name(device)} ({device.architecture_name}): {reason}")


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
    (`max_gpt2.model.stored_weights`); every other array is converted to the compute `dtype`, and
    bound without a copy where it is float32 on the host already. An array bound under several
    names (a tied LM head is `wte`'s array) is converted once and bound as one buffer.
    """
    device = CPU() if device is None else device
    stored = weights if isinstance(weights, StoredWeights) else pack(weights, weight_format)
    converted: dict[int, Buffer] = {}
    for name, array in stored.items():
        if id(array) in converted:
            continue
        if is_stored_packed(name, weight_format):
            buffer = packed_buffer(array)
            converted[id(array)] = buffer if device.is_host else buffer.to(device)
        else:
            converted[id(array)] = to_buffer(array, dtype, device)
    return {name: converted[id(array)] for name, array in stored.items()}


def packed_buffer(values: np.ndarray) -> Buffer:
    """A packed weight as stored (`max_gpt2.model.weight_formats`) on the host: int8, uint8 and
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
