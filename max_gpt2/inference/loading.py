"""Loading: one plan for every load (`plan_load`), and `load_lm`, a checkpoint to a compiled language model.

    lm = load_lm("path/to/gpt2")                      # a safetensors directory, file or Hub id
    lm = load_lm("gpt2-q4_0.gguf")                    # a GGUF file, in its own format (here q4_0)
    lm = load_lm("path/to/gpt2", weight_format="q8_0")

`plan_load` makes every decision of a load and every check, before a tensor is read: `load_lm`,
the commands and the server (`max-gpt2 serve` before it starts MAX, and MAX's model worker)
all load through it. Each step is the cheapest one that gives the same model:

- the options are checked before anything is opened, then the checkpoint's header and
  config (`max_gpt2.model.checkpoint.open_checkpoint`) before any tensor is read; the weight
  format is the one asked for, else the checkpoint's own (`stored_weights.choose_format`);
- the weights are memory-mapped as bound (`LoadPlan.weights`): from a GGUF file of float32
  tensors, or from the weights cache, where the first load in a format converts them tensor
  by tensor (`max_gpt2.model.weights_cache`): quantized, or GGUF's blocks shuffled into the
  kernels' layout, never through float32;
- the graphs are read compiled from the artifact cache on the CPU (`max_gpt2.inference.artifacts`),
  else traced and compiled (MAX's own cache makes that seconds after the first time) and kept;
- the tokenizer is the files beside the checkpoint, else a GGUF file's own (`checkpoint_tokenizer`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import NamedTuple

from max.driver import Device
from max.dtype import DType
from tokenizers import Tokenizer

from max_gpt2.inference.lm import CompiledLM, LoadProgress, compiled_with
from max_gpt2.inference.lm_graphs import LMGraphs
from max_gpt2.inference.lm_options import LMOptions
from max_gpt2.inference.tokenizer import checkpoint_tokenizer
from max_gpt2.model.checkpoint import OpenedCheckpoint, open_checkpoint
from max_gpt2.model.stored_weights import StoredWeights
from max_gpt2.model.weight_formats import WeightFormat
from max_gpt2.model.weights_cache import bound_weights


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
    kernels: bool | None = None,
    weight_format: str | WeightFormat | None = None,
    kv_cache: str | DType | None = None,
    *,
    output_attentions: bool = False,
    cache_dir: str | Path | None = None,
) -> LoadPlan:
    """Every decision and check of a load of `checkpoint` (a path, or one `open_checkpoint` opened),
    before any tensor is read; `load_lm`'s arguments."""
    options = LMOptions.check(
        device,
        dtype,
        kernels,
        weight_format,
        kv_cache,
        output_attentions,
        opened := cache(
            lambda: open_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
        ),
    )
    return LoadPlan(opened(), options, None if cache_dir is None else Path(cache_dir))


def load_lm(
    checkpoint: str | Path | OpenedCheckpoint,
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    kernels: bool | None = None,
    weight_format: str | WeightFormat | None = None,
    kv_cache: str | DType | None = None,
    *,
    output_attentions: bool = False,
    progress: LoadProgress | None = None,
    cache_dir: str | Path | None = None,
) -> CompiledLM:
    """Opens a GPT-2 checkpoint (a safetensors directory, file or Hub id, or a GGUF file; or takes one
    opened by `open_checkpoint`), compiles the model and binds its weights.

    `weight_format` is how the projections and the LM head are stored for decoding: "float32",
    "bfloat16", "q8_0" or "q4_0" (`max_gpt2.model.weight_formats`); None: the checkpoint's own
    (float32 for safetensors; a GGUF file's type: F32 and F16 float32, BF16, Q8_0 and Q4_0 their
    own). Another is converted from it, once: converted weights are kept in the weights cache
    under `cache_dir` (None: `max_gpt2.outputs.default_cache_dir()`), and so are compiled graphs. A
    quantized GGUF file loads in its own format or as float32. `kv_cache`, `kernels` and
    `output_attentions` are `compile_lm`'s. Every option is checked before a tensor is read
    (`plan_load`). `progress`, if given, hears of the long steps (`LoadProgress`). The checkpoint's
    tokenizer, if it has one, comes along as `lm.tokenizer`.
    """
    plan = plan_load(
        checkpoint,
        device,
        dtype,
        kernels,
        weight_format,
        kv_cache,
        output_attentions=output_attentions,
        cache_dir=cache_dir,
    )
    lm = compiled_with(plan.graphs(), plan.weights(progress), output_attentions, progress)
    lm.tokenizer = plan.tokenizer()
    return lm
