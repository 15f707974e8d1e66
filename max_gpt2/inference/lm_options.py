"""What the language model is compiled for (`LMOptions`), and the checks on it, each made once per load
before anything is read or compiled: the device, the compute dtype, the weight format (it must run
there; the checkpoint's own where none is asked for), the KV cache's dtype, the kernels, attention
weights MAX computes wrong on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from max.driver import Device
from max.dtype import DType
from typing_extensions import Unpack

from max_gpt2.inference.devices import device_name, gpu_of, kernels_run_on, parse_dtype, resolve_device
from max_gpt2.model.checkpoints.stored_weights import Stored, choose_format
from max_gpt2.model.formats import FLOAT32, WeightFormat, format_named
from max_gpt2.model.gpu_limits import check_attention_weights, check_compiles


def check_weight_format(requested: str | WeightFormat, device: Device, dtype: DType) -> WeightFormat:
    """The format `requested` names (`formats.FORMATS`), if it runs on `device` in `dtype`."""
    return format_named(requested).check_runs(kernels_run_on(device, dtype), _where(device, dtype))


def _where(device: Device, dtype: DType) -> str:
    return f"{device_name(device)} in {dtype.name}"


class CompileOptions(TypedDict, total=False):
    """What a model is compiled for beside its device and dtype, as given (unchecked): `compile_lm`'s,
    `load_lm`'s and `plan_load`'s options, written once here and checked in one place
    (`LMOptions.check`).

    `kernels`: whether decoding steps run through the Mojo kernels (None where they run, False for
    MAX's ops everywhere); `weight_format`: how the projections and the LM head are stored (None:
    the checkpoint's own); `kv_cache`: the KV cache's dtype (None: the format's default);
    `output_attentions`: compile the graph that also returns attention weights."""

    kernels: bool | None
    weight_format: str | WeightFormat | None
    kv_cache: str | DType | None
    output_attentions: bool


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
        checkpoint: Callable[[], Stored] | None = None,
        **options: Unpack[CompileOptions],
    ) -> LMOptions:
        """The options, or a ValueError for what cannot run, before any weight is read: the kernels
        where they do not run (`kernels`: None, where they run), what MAX computes wrong or cannot
        compile on the device (`max_gpt2.model.gpu_limits`: attention weights, the checkpoint's width),
        a weight format off the CPU in float32 (`WeightFormat.check_runs`), a KV cache dtype
        (`WeightFormat.cache_dtype`).

        `weight_format` None is the checkpoint's own, float32 without one. `checkpoint`, called once
        all that is checked for the format asked for (or float32), opens the checkpoint the format is
        chosen for (`stored_weights.choose_format`: a quantized one only as itself or float32).
        Without it the width is checked where the graphs are made (`LMGraphs`).
        """
        kernels, weight_format = options.get("kernels"), options.get("weight_format")
        kv_cache, output_attentions = options.get("kv_cache"), options.get("output_attentions", False)
        # The device's facts first, then the model's rules on them.
        target, compute_dtype = resolve_device(device), parse_dtype(dtype)
        cache = None if kv_cache is None else parse_dtype(kv_cache, "kv_cache")
        runs_here, where, gpu = (
            kernels_run_on(target, compute_dtype),
            _where(target, compute_dtype),
            gpu_of(target),
        )
        if kernels and not runs_here:
            raise ValueError(f"the decoding kernels run on the CPU in float32, not on {where}")
        if output_attentions:
            check_attention_weights(gpu, compute_dtype)
        requested = None if weight_format is None else format_named(weight_format)
        asked = (requested or FLOAT32).check_runs(runs_here, where)
        asked.cache_dtype(cache, compute_dtype)  # refused before the checkpoint is opened
        if checkpoint is not None:
            stored = checkpoint()
            asked = choose_format(stored, requested).check_runs(runs_here, where)
            check_compiles(gpu, compute_dtype, stored.config.n_embd)
        kv_dtype = asked.cache_dtype(cache, compute_dtype)
        return cls(target, compute_dtype, asked, kv_dtype, runs_here and kernels is not False)

    def describe(self) -> str:
        """`"cpu float32"`, and the weights' format and the KV cache's dtype where not the plain ones."""
        packed = self.weight_format.kernels_only
        stored = f", weights in {self.weight_format}" if packed else ""
        if packed or self.kv_dtype != self.dtype:
            stored += f", KV cache in {self.kv_dtype.name}"
        return f"{device_name(self.device)} {self.dtype.name}{stored}"
