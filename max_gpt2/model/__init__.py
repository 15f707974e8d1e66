"""What GPT-2 is, as MAX modules: its config, its checkpoint and weights, and its module tree.

No sessions and no compiling here (that is `max_gpt2.inference`), only definitions:

    config.py           GPT2Config: shapes, validation, config.json
    dtypes.py           compute dtype names; bfloat16 on the NumPy side
    hub.py              a local path or a Hugging Face Hub id
    checkpoint.py       Checkpoint: safetensors files, shards, pickle refusal, tensors read lazily;
                        open_checkpoint: a safetensors checkpoint or a GGUF file
    gguf_file.py        GGUFFile: a GGUF file's header checked, its tensors memory-mapped
    gguf_checkpoint.py  GGUFCheckpoint: GPT-2 as llama.cpp stores it; and the tensors to write one
    gguf_writer.py      write_gguf: a GGUF file written tensor by tensor, renamed into place whole
    weight_adapters.py  the adapter: Hugging Face state dict -> MAX-layout parameters
    attention.py        GPT2Attention (impl "graph") and causal_mask
    flash.py            impl "flash": GPU flash kernel; CPU tiled causal graph
    wrapper.py          impl "wrapper": one head at a time, the benchmark baseline
    cached_attention.py CachedAttention: attention over a KV cache written in place
    kernel_layers.py    SkinnyLinear, KernelCachedAttention, KernelBlock: the same layers through Mojo
                        kernels; block_for: the kernel block where it fits, else Block
    weight_formats.py   how the projections and the LM head are stored: float32, bfloat16, q8_0, q4_0
    stored_weights.py   a parameter as a checkpoint stores it -> as a compiled model binds it
    weights_cache.py    weights converted once per format, kept by content, memory-mapped after
    packed_linear.py    PackedLinear: a projection with its weight in a packed format
    block.py            Block: ln_1, the attention it is given, ln_2, MLP
    gpt2.py             GPT2LMHeadModel: embeddings, blocks, ln_f, LM head
"""

from max_gpt2.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GPT2Attention": "max_gpt2.model.attention",
        "causal_mask": "max_gpt2.model.attention",
        "Block": "max_gpt2.model.block",
        "Checkpoint": "max_gpt2.model.checkpoint",
        "load_attention_weights": "max_gpt2.model.checkpoint",
        "GPT2Config": "max_gpt2.model.config",
        "GPT2LMHeadModel": "max_gpt2.model.gpt2",
        "GPT2Model": "max_gpt2.model.gpt2",
        "CheckpointError": "max_gpt2.model.weight_adapters",
    },
)

__all__ = [
    "Block",
    "Checkpoint",
    "CheckpointError",
    "GPT2Attention",
    "GPT2Config",
    "GPT2LMHeadModel",
    "GPT2Model",
    "causal_mask",
    "load_attention_weights",
]
