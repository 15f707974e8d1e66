"""GPT-2 on MAX: its multi-head causal self-attention, and the whole language model around it.

    from max_gpt2 import from_pretrained, load_lm
    attention = from_pretrained("path/to/gpt2", layer=0)   # one layer's attention, compiled
    y = attention(x)                                       # x: [batch, seq, n_embd] NumPy
    lm = load_lm("path/to/gpt2")                           # the whole model, compiled
    tokens = lm.generate(input_ids, max_new_tokens=20)     # [batch, seq + 20] int64

The data path, one module each: `config` (shapes) and `weights` (the checkpoint
adapter); the MAX modules `attention` (with `flash` and `wrapper`), `cached_attention`
and `model`; compiled and run by `runtime` (attention) and `lm` (the model, with
`inputs` and `sampling`, both through `compiled`); text through `tokenizer`.
Attention weights: `CompiledLM.attentions`, summarized by `head_summary`, drawn by
`gallery`. Checked by `reference` (NumPy, float64) under `verify`'s tolerances, on
`testing`'s seeded checkpoints. Commands: `cli`, `bench`, `generation`, `heads`.
"""

from max_gpt2.attention import GPT2Attention, causal_mask
from max_gpt2.config import GPT2Config
from max_gpt2.lm import CompiledLM, Step, compile_lm, load_lm
from max_gpt2.runtime import CompiledAttention, compile_attention, from_pretrained
from max_gpt2.weights import Checkpoint, CheckpointError, load_attention_weights

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CompiledAttention",
    "CompiledLM",
    "GPT2Attention",
    "GPT2Config",
    "Step",
    "causal_mask",
    "compile_attention",
    "compile_lm",
    "from_pretrained",
    "load_attention_weights",
    "load_lm",
]
