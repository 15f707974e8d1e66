"""The language model's graph variants, each compiled the first time it is needed.

    PLAIN       `GPT2LMHeadModel` with MAX's ops: prompts, `logits`, and steps off the CPU
    DECODE      the same modules through the Mojo decoding kernels: steps on the CPU in float32,
                and prompts too where the weights are packed (every format but float32)
    ATTENTIONS  the plain graph that also outputs every head's attention weights
    scores      the prompt graph returning each next token's log-probability [batch, K], not
                logits: scoring never copies [seq, vocab] to the host (`LMGraphs.scoring`)
    ranked      scores that also returns the `RANKED` likeliest tokens' log-probabilities and
                ids at each position [batch, K, RANKED] (`score(top_k=...)`)
    hidden      the prompt graph returning the final layer norm's output [batch, K, n_embd], not
                logits: what embeddings pool (`max_gpt2.inference.embeddings`)
    REORDER     beam search's cache reorder, on the CPU: each layer's rows copied from their
                parents in place (`gpt2_reorder_rows`), inputs rows [batch], mask [batch, total]

(`max_gpt2.model.layers.variants` says what each computes.) Packed weights run prompts through the
kernels as well: one graph per format, the same arithmetic for a prompt's logits as for a step's
(as llama.cpp, q8_0 and q4_0 quantize the activations of both), at about the speed of MAX's
matmul on unpacked weights (docs/performance.md).

Every model variant takes the same inputs (`max_gpt2.inference.lm_trace`, which traces them), the KV
cache in the compute dtype or float16 (`kv_cache="float16"` with float32 compute, and by default
beside packed weights): half the bytes a decoding step's attention reads, as llama.cpp keeps its
cache by default. On the CPU the compiled variants are kept on disk (`max_gpt2.inference.artifacts`).
`LMGraphs` refuses what MAX cannot compile for the config, once per load.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from max_gpt2.inference.artifacts import ArtifactCache
from max_gpt2.inference.compiled import GraphVariants
from max_gpt2.inference.devices import gpu_of
from max_gpt2.inference.lm_options import LMOptions
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.gpu_limits import check_compiles
from max_gpt2.model.layers.variants import DECODE, PLAIN, CacheReorder, Head, Variant
from max_gpt2.outputs import default_cache_dir

if TYPE_CHECKING:
    from max.graph import Graph


class LMGraphs(GraphVariants):
    """GPT-2's graph variants for a config and `LMOptions` (module docstring).

    `DECODE` is the plain graph with the Mojo decoding kernels, staged only where they run
    (`LMOptions.kernels`); `step_variant` and `prompt_variant` are the variants that run decoding
    steps and prompts here, and `scoring` the prompt variant returning log-probabilities (and the
    likeliest tokens'). What MAX cannot compile for the config on the device
    (`gpu_limits.check_compiles`) is refused here.
    """

    def __init__(self, config: GPT2Config, options: LMOptions, cache: Path | None = None) -> None:
        """`cache`: where compiled graphs are kept on the CPU (`max_gpt2.inference.artifacts`; None:
        the cache directory's `graphs`)."""
        check_compiles(gpu_of(options.device), options.dtype, config.n_embd)
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
        self.step_variant = DECODE if options.kernels else PLAIN
        self.prompt_variant = self.step_variant if options.weight_format.kernels_only else PLAIN

    def scoring(self, ranked: bool = False) -> Variant:
        """The prompt variant returning the next tokens' log-probabilities, and with `ranked` the likeliest
        tokens' too."""
        return Variant(Head.RANKED if ranked else Head.SCORES, self.prompt_variant.kernels)

    @property
    def hidden(self) -> Variant:
        """The prompt variant returning the final layer norm's output, which embeddings pool."""
        return Variant(Head.HIDDEN, self.prompt_variant.kernels)

    def _trace(self, variant: Variant | CacheReorder) -> Graph:
        # MAX's graph-building modules take about a second to import: only a process that traces imports
        # them (`max_gpt2.inference.lm_trace`), not one that reads its graphs compiled.
        from max_gpt2.inference.lm_trace import trace_lm

        return trace_lm(self.config, self.options, variant)
