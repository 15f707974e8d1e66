"""GPT-2 on MAX: its multi-head causal self-attention, and the whole language model around it.

    from max_gpt2 import from_pretrained, load_lm
    attention = from_pretrained("path/to/gpt2", layer=0)   # one layer's attention, compiled
    y = attention(x)                                       # x: [batch, seq, n_embd] NumPy
    lm = load_lm("path/to/gpt2")                           # the whole model, compiled
    tokens = lm.generate(input_ids, max_new_tokens=20)     # [batch, seq + 20] int64

The subpackages follow the data path, checkpoint -> adapter -> stored weights -> modules ->
compiled graphs -> tokens -> server; docs/architecture.md describes each package and module.
"""

from max_gpt2.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CompiledAttention": "max_gpt2.inference",
        "CompiledLM": "max_gpt2.inference",
        "Constraint": "max_gpt2.inference",
        "KVCache": "max_gpt2.inference",
        "Sampler": "max_gpt2.inference",
        "Step": "max_gpt2.inference",
        "compile_attention": "max_gpt2.inference",
        "compile_lm": "max_gpt2.inference",
        "from_pretrained": "max_gpt2.inference",
        "load_lm": "max_gpt2.inference",
        "load_tokenizer": "max_gpt2.inference",
        "Checkpoint": "max_gpt2.model",
        "CheckpointError": "max_gpt2.model",
        "GPT2Attention": "max_gpt2.model",
        "GPT2Config": "max_gpt2.model",
        "causal_mask": "max_gpt2.model",
        "load_attention_weights": "max_gpt2.model",
    },
)

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CompiledAttention",
    "CompiledLM",
    "Constraint",
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
