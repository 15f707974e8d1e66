"""The language model's graph variants, each compiled the first time it is needed.

    "plain"       `GPT2LMHeadModel` with MAX's ops: prompts, `logits`, and steps off the CPU
    "decode"      the same modules through the Mojo decoding kernels: steps on the CPU in float32
    "attentions"  the plain graph that also outputs every head's attention weights

Every variant takes the same inputs, every length symbolic: input ids and
position ids `[batch, seq]` int64, the attention mask `[batch, total]` int64, the
positions whose logits are wanted `[logits]` int64, and one KV cache buffer per
layer `[2, batch, n_head, max_len, head_dim]`, written in place.
"""

from __future__ import annotations

from max.driver import Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import TensorType, default_device, default_dtype
from max.graph import BufferType, DeviceRef, Graph

from max_gpt2.inference.compiled import GraphVariants
from max_gpt2.inference.devices import device_name
from max_gpt2.kernels import kernels_run_on
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.gpt2 import GPT2LMHeadModel
from max_gpt2.model.weight_formats import check_format


class LMGraphs(GraphVariants):
    """GPT-2's graph variants for one config, device and dtype: `"plain"`, `"attentions"`, `"decode"`.

    `"decode"` is the plain graph with the Mojo decoding kernels, staged only
    where they run (`kernels_run_on`); `step_variant` names the variant that
    runs decoding steps here.
    """

    def __init__(
        self,
        config: GPT2Config,
        device: Device,
        dtype: DType,
        kernels: bool | None = None,
        weight_format: str = "float32",
    ) -> None:
        super().__init__(device, self._trace)
        self.config, self.device, self.dtype = config, device, dtype
        self.weight_format = check_format(weight_format)
        runs_here = kernels_run_on(device, dtype)
        if weight_format != "float32" and not runs_here:
            where = f"{device_name(device)} in {dtype.name}"
            raise ValueError(
                f"weights={weight_format!r} is for decoding on the CPU in float32, not on {where}"
            )
        if kernels and not runs_here:
            where = f"{device_name(device)} in {dtype.name}"
            raise ValueError(f"the decoding kernels run on the CPU in float32, not on {where}")
        self.step_variant = "decode" if runs_here and kernels is not False else "plain"

    def _trace(self, variant: str) -> Graph:
        config, device = self.config, self.device
        with F.lazy(), default_device(device), default_dtype(self.dtype):
            # lazy: random initial weights are never made
            module = GPT2LMHeadModel(
                config, variant == "attentions", kernels=variant == "decode", weights=self.weight_format
            )
        tokens = TensorType(DType.int64, ["batch", "seq"], device=device)
        mask = TensorType(DType.int64, ["batch", "total"], device=device)
        logit_index = TensorType(DType.int64, ["logits"], device=device)
        device_ref = DeviceRef.from_device(device)
        cache = BufferType(self.dtype, [2, "batch", config.n_head, "max_len", config.head_dim], device_ref)
        inputs = [tokens, tokens, mask, logit_index, *[cache] * config.n_layer]
        return module.trace(*inputs, name=f"GPT2LMHeadModel_{variant}").graph
