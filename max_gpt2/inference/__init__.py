"""Running GPT-2: compiled graphs on a device, the steps of generation and scoring, and text in and out.

`load_lm` and `compile_lm` give a `CompiledLM`, `compile_attention` and `from_pretrained` a
`CompiledAttention`. docs/architecture.md lists the modules and the graph variants;
docs/generation.md and docs/scoring.md show the API.
"""

from max_gpt2.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CompiledAttention": "max_gpt2.inference.attention",
        "compile_attention": "max_gpt2.inference.attention",
        "from_pretrained": "max_gpt2.inference.attention",
        "Constraint": "max_gpt2.inference.constraints",
        "Step": "max_gpt2.inference.generation",
        "KVCache": "max_gpt2.inference.kv_cache",
        "CompiledLM": "max_gpt2.inference.lm",
        "compile_lm": "max_gpt2.inference.loading",
        "load_lm": "max_gpt2.inference.loading",
        "Sampler": "max_gpt2.inference.sampling",
        "load_tokenizer": "max_gpt2.inference.tokenizer",
    },
)

__all__ = [
    "CompiledAttention",
    "CompiledLM",
    "Constraint",
    "KVCache",
    "Sampler",
    "Step",
    "compile_attention",
    "compile_lm",
    "from_pretrained",
    "load_lm",
    "load_tokenizer",
]
