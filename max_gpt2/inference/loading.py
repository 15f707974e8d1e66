"""Loading: one plan for every load (`plan_load`), `load_lm` (a checkpoint to a compiled language
model) and `compile_lm` (parameters to one).

    lm = load_lm("path/to/gpt2")                      # a safetensors directory, file or Hub id
    lm = load_lm("gpt2-q4_0.gguf")                    # a GGUF file, in its own format (here q4_0)
    lm = load_lm("path/to/gpt2", weight_format="q8_0")
    lm = compile_lm(config, weights, "cpu", weight_format="q4_0")   # parameters already in memory

Their options beside the device, dtype and cache directory are one set (`lm_options.CompileOptions`),
checked in one place (`LMOptions.check`).

`plan_load` makes every decision of a load and every check, before a tensor is read: `load_lm`,
the commands and the server (`max-gpt2 serve` before it starts MAX, and MAX's model worker)
all load through it. Each step is the cheapest one that gives the same model:

- the options are checked before anything is opened, then the checkpoint's header and
  config (`max_gpt2.model.checkpoints.checkpoint.open_checkpoint`) before any tensor is read; the weight
  format is the one asked for, else the checkpoint's own (`stored_weights.choose_format`);
- the weights are memory-mapped as bound (`LoadPlan.weights`): from a GGUF file of float32
  tensors, or from the weights cache, where the first load in a format converts them tensor
  by tensor (`max_gpt2.model.checkpoints.weights_cache`): quantized, or GGUF's blocks shuffled into the
  kernels' layout, never through float32;
- the graphs are read compiled from the artifact cache on the CPU (`max_gpt2.inference.artifacts`),
  else traced and compiled (MAX's own cache makes that seconds after the first time) and kept;
- the tokenizer is the files beside the checkpoint, else a GGUF file's own (`checkpoint_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
from max.driver import Device
from max.dtype import DType
from tokenizers import Tokenizer
from typing_extensions import Unpack

from max_gpt2.inference.lm import CompiledLM
from max_gpt2.inference.lm_graphs import LMGraphs
from max_gpt2.inference.lm_options import CompileOptions, LMOptions
from max_gpt2.inference.tokenizer import checkpoint_tokenizer
from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint, open_checkpoint
from max_gpt2.model.checkpoints.stored_weights import StoredWeights, check_lm_weights
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.layers.variants import ATTENTIONS, Variant


class LoadProgress(Protocol):
    """Where `load_lm` reports its long steps (the CLI's `max_gpt2.outputs.Progress` is one)."""

    def note(self, message: str) -> None:
        """A line of its own."""

    def step(self, label: str) -> AbstractContextManager[Any]:
        """Around a step that takes a while: reading the weights, compiling."""


class LoadPlan(NamedTuple):
    """A load decided and checked (`plan_load`): the opened checkpoint, what it is compiled for, and the
    cache directory (None: `max_gpt2.outputs.default_cache_dir()`)."""

    checkpoint: OpenedCheckpoint
    options: LMOptions
    cache: Path | None

    def weights(self, progress: LoadProgress | None = None) -> StoredWeights:
        """The parameters as bound in the plan's weight format, converted once into the weights cache where
        they are not bound as they lie (`progress` hears of that)."""
        step = None if progress is None else progress.step
        return bound_weights(self.checkpoint, self.options.weight_format, self.cache, step)

    def graphs(self) -> LMGraphs:
        """The language model's graph variants for the plan, none compiled yet."""
        kept = None if self.cache is None else self.cache / "graphs"
        return LMGraphs(self.checkpoint.config, self.options, kept)

    def tokenizer(self) -> Tokenizer | None:
        return checkpoint_tokenizer(self.checkpoint)


def plan_load(
    checkpoint: str | Path | OpenedCheckpoint,
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    *,
    cache_dir: str | Path | None = None,
    **options: Unpack[CompileOptions],
) -> LoadPlan:
    """Every decision and check of a load of `checkpoint` (a path, or one `open_checkpoint` opened),
    before any tensor is read; `load_lm`'s arguments."""
    opened = cache(lambda: open_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint)
    checked = LMOptions.check(device, dtype, opened, **options)
    return LoadPlan(opened(), checked, None if cache_dir is None else Path(cache_dir))


def load_lm(
    checkpoint: str | Path | OpenedCheckpoint,
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    *,
    progress: LoadProgress | None = None,
    cache_dir: str | Path | None = None,
    **options: Unpack[CompileOptions],
) -> CompiledLM:
    """Opens a GPT-2 checkpoint (a safetensors directory, file or Hub id, or a GGUF file; or takes one
    opened by `open_checkpoint`), compiles the model and binds its weights.

    `weight_format` is how the projections and the LM head are stored for decoding (one of
    `max_gpt2.model.formats.FORMATS`); None: the checkpoint's own (float32 for safetensors;
    a GGUF file's type, or its mix of them). Another is converted from it, once: converted
    weights are kept in the weights cache under `cache_dir` (None:
    `max_gpt2.outputs.default_cache_dir()`), and so are compiled graphs. A quantized GGUF file
    loads in its own format or as float32. The other options are `compile_lm`'s
    (`lm_options.CompileOptions`), every one checked before a tensor is read
    (`plan_load`). `progress`, if given, hears of the long steps (`LoadProgress`). The
    checkpoint's tokenizer, if it has one, comes along as `lm.tokenizer`.
    """
    plan = plan_load(checkpoint, device, dtype, cache_dir=cache_dir, **options)
    graphs = plan.graphs()
    lm = compiled_with(graphs, plan.weights(progress), first_variants(graphs, options), progress)
    lm.tokenizer = plan.tokenizer()
    return lm


def compile_lm(
    config: GPT2Config,
    weights: Mapping[str, np.ndarray],
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    **options: Unpack[CompileOptions],
) -> CompiledLM:
    """Compiles GPT-2 for `device` and `dtype` and binds `weights` (`Checkpoint.model_weights()`).

    Compiled now: the graphs `generate` runs (prompt and steps, as one module: the kernels they
    share compile once), or with `output_attentions` only the variant `CompiledLM.attentions`
    runs; any other the first time it is needed. A `weight_format` other than float32 is packed
    from the float32 `weights` here (all but float32 for the CPU in float32); `kv_cache` is the
    compute dtype or "float16" with float32 compute (half the bytes a step's attention reads),
    None the format's default (`lm_options.CompileOptions`). What MAX cannot compile on the
    device (`gpu_limits.hopper_refusal`), or computes wrong there, is refused before compiling.
    """
    graphs = LMGraphs(config, LMOptions.check(device, dtype, **options))
    return compiled_with(graphs, weights, first_variants(graphs, options))


def first_variants(graphs: LMGraphs, options: CompileOptions) -> list[Variant]:
    """What a load compiles before it returns: the graph that outputs attention weights where asked
    (`output_attentions`), else the prompt's and the steps' (generation's)."""
    return [ATTENTIONS] if options.get("output_attentions") else [graphs.prompt_variant, graphs.step_variant]


def compiled_with(
    graph: LMGraphs,
    weights: Mapping[str, np.ndarray],
    variants: Sequence[Variant],
    progress: LoadProgress | None = None,
) -> CompiledLM:
    """`variants` of `graph` compiled (read where kept) and `weights` bound, checked first
    (`check_lm_weights`); any other variant is compiled the first time it is needed."""
    weights = check_lm_weights(weights, graph.config, graph.options.weight_format)  # before compiling
    names = sorted({variant.name for variant in variants} - {"plain", "decode"})
    what = f"GPT-2 ({', '.join(names)})" if names else "GPT-2"
    kept = graph.kept(*variants)
    if progress is not None and not kept:
        progress.note(
            "(a new graph takes a minute or two to compile; kept compiled, later loads take a moment)"
        )
    doing = "reading compiled" if kept else "compiling"
    with step(progress, f"{doing} {what} for {graph.options.describe()}"):
        graph.compile(*variants)
    if progress is not None:
        graph.announce = progress.step  # the variants asked for later: scores, beam search's reorder
    return CompiledLM(graph.config, graph.options.device, graph.options.dtype, graph, weights)


def step(progress: LoadProgress | None, label: str) -> AbstractContextManager[Any]:
    return nullcontext() if progress is None else progress.step(label)
