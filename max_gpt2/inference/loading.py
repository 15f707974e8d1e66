"""`load_lm`: a checkpoint on disk to a compiled language model with its weights bound, quickly.

    lm = load_lm("path/to/gpt2")                      # a safetensors directory, file or Hub id
    lm = load_lm("gpt2-q4_0.gguf")                    # a GGUF file, in its own format (here q4_0)
    lm = load_lm("path/to/gpt2", weight_format="q8_0")

Each step is the cheapest one that gives the same model:

- the options are checked before anything is opened, then the checkpoint's header and
  config (`max_gpt2.model.checkpoint.open_checkpoint`) before any tensor is read;
- the weights are memory-mapped as bound: from a GGUF file of float32 tensors, or from the
  weights cache, where the first load in a format converts them tensor by tensor
  (`max_gpt2.model.weights_cache`): quantized, or GGUF's blocks shuffled into the kernels'
  layout, never through float32;
- the graphs are read compiled from the artifact cache on the CPU (`max_gpt2.inference.artifacts`),
  else traced and compiled (MAX's own cache makes that seconds after the first time) and kept;
- the tokenizer is the files beside the checkpoint, else the GGUF file's own.
"""

from __future__ import annotations

from pathlib import Path

from max.driver import Device
from max.dtype import DType

from max_gpt2.inference.lm import CompiledLM, LoadProgress, compiled_with
from max_gpt2.inference.lm_graphs import LMGraphs, LMOptions
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoint import Checkpoint, open_checkpoint
from max_gpt2.model.gguf_checkpoint import GGUFCheckpoint
from max_gpt2.model.stored_weights import check_conversion
from max_gpt2.model.weight_formats import check_format, renamed_weights_keyword
from max_gpt2.model.weights_cache import bound_weights


def load_lm(
    checkpoint: str | Path | Checkpoint | GGUFCheckpoint,
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    kernels: bool | None = None,
    weight_format: str | None = None,
    kv_cache: str | DType | None = None,
    *,
    output_attentions: bool = False,
    progress: LoadProgress | None = None,
    weights: str | None = None,
    cache_dir: str | Path | None = None,
) -> CompiledLM:
    """Opens a GPT-2 checkpoint (a safetensors directory, file or Hub id, or a GGUF file; or takes one
    opened by `open_checkpoint`), compiles the model and binds its weights.

    `weight_format` is how the projections and the LM head are stored for decoding: "float32",
    "bfloat16", "q8_0" or "q4_0" (`max_gpt2.model.weight_formats`); None: the checkpoint's own
    (float32 for safetensors; a GGUF file's type: F32 and F16 float32, BF16, Q8_0 and Q4_0 their
    own). Another is converted from it, once: converted weights are kept in the weights cache
    under `cache_dir` (None: `max_gpt2.outputs.default_cache_dir()`), and so are compiled graphs. A
    quantized GGUF file loads in its own format or as float32. `weights` is `weight_format`'s
    deprecated name. `kv_cache`, `kernels` and `output_attentions` are `compile_lm`'s. Every option
    is checked before a tensor is read. `progress`, if given, hears of the long steps
    (`LoadProgress`). The checkpoint's tokenizer, if it has one, comes along as `lm.tokenizer`.
    """
    requested = (
        weight_format if weights is None else renamed_weights_keyword("load_lm", weight_format, weights)
    )
    LMOptions.check(device, dtype, kernels, check_format(requested or "float32"), kv_cache, output_attentions)
    opened = (
        checkpoint if isinstance(checkpoint, (Checkpoint, GGUFCheckpoint)) else open_checkpoint(checkpoint)
    )
    chosen = requested or opened.weight_format
    options = LMOptions.check(device, dtype, kernels, chosen, kv_cache, output_attentions)
    check_conversion(opened.source_format, chosen, str(opened.path))
    cache = None if cache_dir is None else Path(cache_dir)
    graph = LMGraphs(opened.config, options, None if cache is None else cache / "graphs")
    stored = bound_weights(opened, chosen, cache, None if progress is None else progress.step)
    lm = compiled_with(graph, stored, output_attentions, progress)
    metadata = opened.gguf.metadata if isinstance(opened, GGUFCheckpoint) else None
    lm.tokenizer = load_tokenizer(opened.path, metadata)
    return lm
