"""The language model's graph variants, each compiled the first time it is needed, and the checks on
what they are compiled for.

    "plain"       `GPT2LMHeadModel` with MAX's ops: prompts, `logits`, and steps off the CPU
    "decode"      the same modules through the Mojo decoding kernels: steps on the CPU in float32,
                  and prompts too where the weights are packed (bfloat16, q8_0, q4_0)
    "attentions"  the plain graph that also outputs every head's attention weights
    "scores"      the prompt graph returning each next token's log-probability [batch, K], not
                  logits: scoring never copies [seq, vocab] to the host
    "ranked"      "scores" that also returns the `RANKED` likeliest tokens' log-probabilities and
                  ids at each position [batch, K, RANKED] (`score(top_k=...)`)
    "reorder"     beam search's cache reorder, on the CPU: each layer's rows copied from their
                  parents in place (`gpt2_reorder_rows`), inputs rows [batch], mask [batch, total]

Packed weights run prompts through the kernels as well: one graph per format, the same
arithmetic for a prompt's logits as for a step's (as llama.cpp, q8_0 and q4_0 quantize the
activations of both), at about the speed of MAX's matmul on unpacked weights (docs/performance.md).

Every model variant takes the same inputs (`max_gpt2.inference.lm_trace`, which traces them), the KV
cache in the compute dtype or float16 (`kv_cache="float16"` with float32 compute, and by default
beside packed weights): half the bytes a decoding step's attention reads, as llama.cpp keeps its
cache by default. On the CPU the compiled variants are kept on disk (`max_gpt2.inference.artifacts`).

`LMOptions.check` refuses what cannot run before anything is read or compiled, and
`LMGraphs` what MAX cannot compile for the config: each check once per load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from max.driver import Device
from max.dtype import DType

from max_gpt2.inference.artifacts import ArtifactCache
from max_gpt2.inference.compiled import GraphVariants
from max_gpt2.inference.devices import (
    check_attention_weights_on,
    check_compiles_on,
    device_name,
    kernels_run_on,
    resolve_device,
)
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.dtypes import parse_dtype
from max_gpt2.model.weight_formats import check_format
from max_gpt2.outputs import default_cache_dir

# The prompt graph reduced to log-probabilities in the graph, and with the likeliest tokens beside them.
SCORING_VARIANTS = ("scores", "ranked")

if TYPE_CHECKING:
    from max.graph import Graph


def check_weight_format(weight_format: str, device: Device, dtype: DType) -> str:
    """`weight_format` if it names a format (`weight_formats.FORMATS`) that runs on `device` in `dtype`."""
    check_format(weight_format)
    if weight_format != "float32" and not kernels_run_on(device, dtype):
        raise ValueError(
            f"weight_format={weight_format!r} is for decoding on the CPU in float32, not on "
            f"{_where(device, dtype)}"
        )
    return weight_format


def _where(device: Device, dtype: DType) -> str:
    return f"{device_name(device)} in {dtype.name}"


def default_kv_cache(weight_format: str, dtype: DType) -> DType:
    """The KV cache's dtype when none is asked for: float16 beside packed weights (which run in float32
    compute), as llama.cpp keeps its cache; else the compute dtype.

    Beside a packed format's own rounding a float16 cache's does not show in perplexity, and a
    batch's steps read half the cache's bytes (docs/performance.md). Float32 weights keep the cache
    in their dtype, Hugging Face's numbers.
    """
    return DType.float16 if weight_format != "float32" and dtype == DType.float32 else dtype


def check_kv_cache(kv_cache: str | DType | None, dtype: DType, weight_format: str = "float32") -> DType:
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
    weight_format: str
    kv_dtype: DType
    kernels: bool

    @classmethod
    def check(
        cls,
        device: str | Device = "auto",
        dtype: str | DType = "float32",
        kernels: bool | None = None,
        weight_format: str = "float32",
        kv_cache: str | DType | None = None,
        output_attentions: bool = False,
    ) -> LMOptions:
        """The options, or a ValueError for what cannot run, before any weight is read: a weight format
        off the CPU in float32 (`check_weight_format`), a KV cache dtype (`check_kv_cache`), the
        kernels where they do not run (`kernels`: None, where they run), and attention weights
        MAX computes wrong on the device (`devices.check_attention_weights_on`)."""
        target, compute_dtype = resolve_device(device), parse_dtype(dtype)
        check_weight_format(weight_format, target, compute_dtype)
        kv_dtype = check_kv_cache(kv_cache, compute_dtype, weight_format)
        runs_here = kernels_run_on(target, compute_dtype)
        if kernels and not runs_here:
            raise ValueError(
                f"the decoding kernels run on the CPU in float32, not on {_where(target, compute_dtype)}"
            )
        if output_attentions:
            check_attention_weights_on(target, compute_dtype)
        return cls(target, compute_dtype, weight_format, kv_dtype, runs_here and kernels is not False)

    def describe(self) -> str:
        """`"cpu float32"`, and the weights' format and the KV cache's dtype where not the plain ones."""
        stored = "" if self.weight_format == "float32" else f", weights in {self.weight_format}"
        if self.weight_format != "float32" or self.kv_dtype != self.dtype:
            stored += f", KV cache in {self.kv_dtype.name}"
        return f"{device_name(self.device)} {self.dtype.name}{stored}"


class LMGraphs(GraphVariants):
    """GPT-2's graph variants for a config and `LMOptions`: "plain", "attentions", "decode", "scores",
    "ranked", "reorder".

    `"decode"` is the plain graph with the Mojo decoding kernels, staged only
    where they run (`LMOptions.kernels`); `step_variant` and `prompt_variant` name
    the variants that run decoding steps and prompts here, and `"scores"` (`"ranked"`) is the
    prompt variant returning log-probabilities (and the likeliest tokens'). What MAX cannot compile
    for the config on the device (`devices.check_compiles_on`) is refused here.
    """

    def __init__(self, config: GPT2Config, options: LMOptions, cache: Path | None = None) -> None:
        """`cache`: where compiled graphs are kept on the CPU (`max_gpt2.inference.artifacts`; None:
        the cache directory's `graphs`)."""
        check_compiles_on(options.device, options.dtype, config.n_embd)
        artifacts = None
        if options.device.is_host:
            # What the graphs compute: tying and the end-of-text ids are the weights' and the caller's.
            shapes = {
                k: v for k, v in config.to_dict().items() if k not in ("tie_word_embeddings", "eos_token_id")
            }
            identity = {"config": shapes, "options": options.describe(), "kernels": options.kernels}
            artifacts = ArtifactCache(cache or default_cache_dir() / "graphs", identity)
        super().__init__(options.device, self._trace, artifacts)
        self.config, self.options = config, options
        self.step_variant = "decode" if options.kernels else "plain"
        self.prompt_variant = self.step_variant if options.weight_format != "float32" else "plain"

    def _trace(self, variant: str) -> Graph:
        # MAX's graph-building modules take about a second to import: only a process that traces imports
        # them (`max_gpt2.inference.lm_trace`), not one that reads its graphs compiled.
        from max_gpt2.inference.lm_trace import trace_lm

        kernels = variant == "decode" or (variant in SCORING_VARIANTS and self.prompt_variant == "decode")
        return trace_lm(self.config, self.options, variant, kernels)
