"""Running GPT-2: compiled graphs on a device, the steps of generation, and text in and out.

devices.py     device names, what runs where; NumPy arrays and a model's weights to buffers
compiled.py    graph variants compiled on demand, several as one module; CompiledModel
attention.py   compile_attention, from_pretrained: CompiledAttention, one layer's attention
lm.py          compile_lm: CompiledLM (logits, new_cache, prefill, decode_step, attentions)
loading.py     load_lm: a checkpoint (safetensors or GGUF) to a CompiledLM, weights memory-mapped
lm_graphs.py   the LM's graph variants (prompt, CPU decoding step, attentions) and the checks on its options
artifacts.py   compiled graphs kept on disk, read back without tracing
kv_cache.py    KVCache: one buffer per layer, written in place by the steps
generation.py  stream and generate, built on prefill and decode_step; generation_options.py checks them
beam_search.py Hugging Face's beam search, the cache reordered in place (reorder_cache)
context_shift.py  the opt-in context shift past n_positions
stop_strings.py   stop strings across token boundaries; StopTextStream, cut
scoring.py     logprobs and perplexity, built on logits
prompts.py     checks on ids, masks and lengths; position ids
sampling.py    Sampler: the logits controls, then greedy, or temperature, top-k, top-p, min-p
logit_controls.py  penalties, bans (shared with the server); token_history.py what they read
tokenizer.py   load_tokenizer (tokenizer.json, vocab.json + merges.txt, or a GGUF's), TextStream
threads.py     keeps MAX's restless helper thread off the compute workers' cores
"""

from max_gpt2.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CompiledAttention": "max_gpt2.inference.attention",
        "compile_attention": "max_gpt2.inference.attention",
        "from_pretrained": "max_gpt2.inference.attention",
        "Step": "max_gpt2.inference.generation",
        "KVCache": "max_gpt2.inference.kv_cache",
        "CompiledLM": "max_gpt2.inference.lm",
        "compile_lm": "max_gpt2.inference.lm",
        "load_lm": "max_gpt2.inference.loading",
        "Sampler": "max_gpt2.inference.sampling",
        "load_tokenizer": "max_gpt2.inference.tokenizer",
    },
)

__all__ = [
    "CompiledAttention",
    "CompiledLM",
    "KVCache",
    "Sampler",
    "Step",
    "compile_attention",
    "compile_lm",
    "from_pretrained",
    "load_lm",
    "load_tokenizer",
]
