"""What GPT-2 is, as MAX modules: its config, its checkpoint and weights, the weight formats they
are stored in, and its module tree.

Definitions only: no inference sessions and no compiling (that is `max_gpt2.inference`).
docs/architecture.md lists the modules.
"""

from max_gpt2.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GPT2Attention": "max_gpt2.model.layers.attention",
        "causal_mask": "max_gpt2.model.layers.attention",
        "Block": "max_gpt2.model.layers.block",
        "Checkpoint": "max_gpt2.model.checkpoints.checkpoint",
        "load_attention_weights": "max_gpt2.model.checkpoints.checkpoint",
        "GPT2Config": "max_gpt2.model.config",
        "GPT2LMHeadModel": "max_gpt2.model.layers.gpt2",
        "GPT2Model": "max_gpt2.model.layers.gpt2",
        "CheckpointError": "max_gpt2.model.checkpoints.weight_adapters",
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
