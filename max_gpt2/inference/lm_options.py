"""What the language model is compiled for (`LMOptions`), and the checks on it, each made once per load
before anything is read or compiled: the device, the compute dtype, the weight format (it must run
there), the KV cache's dtype (`check_kv_cache`, `default_kv_cache`), the kernels, attention weights
MAX computes wrong on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from max.driver import Device
from max.dtype import DType

from max_gpt2.inference.devices import check_attention_weights_on, device_name, kernels_run_on, resolve_device
from max_gpt2.model.dtypes import parse_dtype
from max_gpt2.model.weight_formats import WeightFormat, format_named


def check_weight_format(requested: str | WeightFormat, device: Device, dtype: DType) -> WeightFormat:
    """The format `requested` names (`weight_formats.FORMATS`), if it runs on `device` in `dtype`."""
    found = format_named(requested)
    if found.kernels_only and not kernels_run_on(device, dtype):
        raise ValueError(
            f"weight_format={found.name!r} is for decoding on the CPU in float32, not on "
            f"{_where(device, dtype)}"
        )
    return found


def _where(device: Device, dtype: DType) -> str:
    return f"{device_name(device)} in {dtype.name}"


def default_kv_cache(weight_format: WeightFormat, dtype: DType) -> DType:
    """The KV cache's dtype when none is asked for: float16 beside packed weights (which run in float32
    compute), as llama.cpp keeps its cache; else the compute dtype.

    Beside a packed format's own rounding a float16 cache's does not show in perplexity, and a
    batch's steps read half the cache's bytes (docs/performance.md). Float32 weights keep the cache
    in their dtype, Hugging Face's numbers.
    """
    return DType.float16 if weight_format.half_cache and dtype == DType.float32 else dtype


def check_kv_cache(kv_cache: str | DType | None, dtype: DType, weight_format: WeightFormat) -> DType:
    """The KV cache's dtype: `default_kv_cache` when `kv_cache` is None, else the compute dtype or
    float16 for float32 compute."""
    if kv_cache is None:
        return default_kv_cache(weight_format, dtype)
    try:
        cache_dtype = parse_dtype(kv_cache)
    except ValueError:
        raise ValueError(
            f"kv_cache must be float32, bfloat16 or float16 (or None); got {kv_cache!r}"
        ) from None
    if cache_dtype != dtype and not (cache_dtype == DType.float16 and dtype == DType.float32):
        raise ValueError(
            f"kv_cache={cache_dtype.name!r} with {dtype.name} compute: the cache is kept in the "
            "compute dtype, or in float16 for float32 compute"
        )
    return cache_dtype


@dataclass(frozen=True)
class LMOptions:
    """What the language model is compiled for, checked (`check`): device, compute dtype, how the
    projections and the LM head are stored, the KV cache's dtype, and whether decoding steps run
    through the Mojo kernels."""

    device: Device
    dtype: DType
    weight_format: WeightFormat
    kv_dtype: DType
    kernels: bool

    @classmethod
    def check(
        cls,
        device: str | Device = "auto",
        dtype: str | DType = "float32",
        kernels: bool | None = None,
        weight_format: str | WeightFormat = "float32",
        kv_cache: str | DType | None = None,
        output_attentions: bool = False,
    ) -> LMOptions:
        """The options, or a ValueError for what cannot run, before any weight is read: a weight format
        off the CPU in float32 (`check_weight_format`), a KV cache dtype (`check_kv_cache`), the
        kernels where they do not run (`kernels`: None, where they run), and attention weights
        MAX computes wrong on the device (`devices.check_attention_weights_on`)."""
        target, compute_dtype = resolve_device(device), parse_dtype(dtype)
        stored = check_weight_format(weight_format, target, compute_dtype)
        kv_dtype = check_kv_cache(kv_cache, compute_dtype, stored)
        runs_here = kernels_run_on(target, compute_dtype)
        if kernels and not runs_here:
            raise ValueError(
                f"the decoding kernels run on the CPU in float32, not on {_where(target, compute_dtype)}"
            )
        if output_attentions:
            check_attention_weights_on(target, compute_dtype)
        return cls(target, compute_dtype, stored, kv_dtype, runs_here and kernels is not False)

    def describe(self) -> str:
        """`"cpu float32"`, and the weights' format and the KV cache's dtype where not the plain ones."""
        packed = self.weight_format.kernels_only
        stored = f", weights in {self.weight_format}" if packed else ""
        if packed or self.kv_dtype != self.dtype:
            stored += f", KV cache in {self.kv_dtype.name}"
        return f"{device_name(self.device)} {self.dtype.name}{stored}"
