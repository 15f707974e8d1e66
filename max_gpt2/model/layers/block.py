"""One GPT-2 layer as MAX modules: `Block` (pre-norm attention and MLP) and what it is made of.

    Block   x + attn(ln_1(x)), then x + mlp(ln_2(x)); x [..., D]
      ln_1, ln_2   LayerNorm over D (statistics in float32)
      attn         given: any attention taking ln_1(x) and the cache inputs that follow x
      mlp: MLP     c_fc [D -> W], the activation (GELU in GPT-2), c_proj [W -> D]; W = mlp_width

`max_gpt2.model.layers.kernel_layers.KernelBlock` is the same block as one Mojo op, for decoding steps.
"""

from __future__ import annotations

from collections.abc import Callable

from max.experimental import functional as F
from max.experimental.nn import LayerNorm, Linear, Module
from max.experimental.tensor import Tensor

from max_gpt2.model.config import ACTIVATIONS, GPT2Config
from max_gpt2.model.layers.attention import GPT2Attention

LinearFactory = Callable[..., Module[[Tensor], Tensor]]
"""Makes a projection: `(in_dim, out_dim, bias=...)`, as `Linear` is called."""
EmbeddingFactory = Callable[..., Module[[Tensor], Tensor]]
"""Makes the token embedding: `(vocab_size, dim=...)`, as `Embedding` is called; ids -> rows."""


def activation(kind: str, x: Tensor) -> Tensor:
    """The MLP's activation `kind` (a value of `ACTIVATIONS`) applied to `x`."""
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "gelu":
        return F.gelu(x, approximate="none")
    if kind == "quick_gelu":  # x * sigmoid(1.702 x)
        return F.gelu(x, approximate="quick")
    functions = {"relu": F.relu, "silu": F.silu, "sigmoid": F.sigmoid, "tanh": F.tanh}
    return x if kind == "linear" else functions[kind](x)


class MLP(Module[[Tensor], Tensor]):
    """`c_fc` [D -> 4D], the activation (GELU in GPT-2), `c_proj` [4D -> D]."""

    def __init__(self, config: GPT2Config, linear: LinearFactory = Linear) -> None:
        self.c_fc = linear(config.n_embd, config.mlp_width, bias=True)
        self.c_proj = linear(config.mlp_width, config.n_embd, bias=True)
        self.activation = ACTIVATIONS[config.activation_function]

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(activation(self.activation, self.c_fc(x)))


def layer_norm(config: GPT2Config) -> LayerNorm:
    # keep_dtype=False: mean and variance in float32 whatever the compute dtype.
    return LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, keep_dtype=False)


class Block(Module[..., Tensor | tuple[Tensor, Tensor]]):
    """One transformer layer: pre-norm attention and MLP, each added to the residual stream.

    The attention is given, so the same block serves our own KV cache
    (`CachedAttention`, or `KernelCachedAttention` for decoding steps) and MAX's
    paged one (`max_gpt2.serving.paged_gpt2.PagedAttention`): whatever follows `x`
    in `forward` goes to it unchanged. `linear` makes the MLP's projections.
    """

    def __init__(self, config: GPT2Config, attn: GPT2Attention, linear: LinearFactory = Linear) -> None:
        self.ln_1 = layer_norm(config)
        self.attn = attn
        self.ln_2 = layer_norm(config)
        self.mlp = MLP(config, linear)

    def forward(self, x: Tensor, *attention_inputs: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """[..., D] -> [..., D], and the attention weights if the attention outputs them."""
        attended = self.attn(self.ln_1(x), *attention_inputs)
        output, weights = attended if self.attn.output_attentions else (attended, None)
        x = x + output
        x = x + self.mlp(self.ln_2(x))
        return (x, weights) if self.attn.output_attentions else x
