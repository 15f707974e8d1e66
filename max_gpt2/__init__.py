"""GPT-2 multi-head causal self-attention as a compiled MAX graph.

    from max_gpt2 import from_pretrained
    attention = from_pretrained("path/to/gpt2", layer=0)   # compile for the best device
    y = attention(x)                                       # x: [batch, seq, n_embd] NumPy

Modules: `config` (shapes), `attention` (the MAX module), `flash` and `wrapper`
(the other implementations), `weights` (reading Hugging Face safetensors),
`runtime` (compile and run), `reference` (NumPy, float64), `verify` (tolerances),
`testing` (deterministic checkpoints), `cli` and `bench` (commands).
"""

from max_gpt2.attention import GPT2Attention, causal_mask
from max_gpt2.config import GPT2Config
from max_gpt2.runtime import CompiledAttention, compile_attention, from_pretrained
from max_gpt2.weights import Checkpoint, CheckpointError, load_attention_weights

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CompiledAttention",
    "GPT2Attention",
    "GPT2Config",
    "causal_mask",
    "compile_attention",
    "from_pretrained",
    "load_attention_weights",
]
