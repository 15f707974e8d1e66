"""GPT-2 on MAX: its multi-head causal self-attention, and the whole language model around it.

    from max_gpt2 import from_pretrained, load_lm
    attention = from_pretrained("path/to/gpt2", layer=0)   # one layer's attention, compiled
    y = attention(x)                                       # x: [batch, seq, n_embd] NumPy
    lm = load_lm("path/to/gpt2")                           # the whole model, compiled
    tokens = lm.generate(input_ids, max_new_tokens=20)     # [batch, seq + 20] int64

The package follows the data path, checkpoint -> adapter -> modules -> compiled
model -> tokens -> server: `model` (what GPT-2 is: config, checkpoint, weights
adapter, MAX modules), `kernels` (Mojo decoding kernels), `inference` (compiled
graphs, prefill and decode steps, generation, sampling, tokenizer) and `serving`
(MAX's serving engine). Beside them: `reference` (NumPy, float64) and `verify`
(tolerances) check the MAX side; `testing` writes seeded checkpoints. Tools that
use the library: `analysis` (attention heads), `cli` (the `max-gpt2` command)
and `bench` (side-by-side benchmarks).
"""

from max_gpt2.inference import (
    CompiledAttention,
    CompiledLM,
    KVCache,
    Sampler,
    Step,
    compile_attention,
    compile_lm,
    from_pretrained,
    load_lm,
    load_tokenizer,
)
from max_gpt2.model import (
    Checkpoint,
    CheckpointError,
    GPT2Attention,
    GPT2Config,
    causal_mask,
    load_attention_weights,
)

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CompiledAttention",
    "CompiledLM",
    "GPT2Attention",
    "GPT2Config",
    "KVCache",
    "Sampler",
    "Step",
    "causal_mask",
    "compile_attention",
    "compile_lm",
    "from_pretrained",
    "load_attention_weights",
    "load_lm",
    "load_tokenizer",
]
