"""The GPT-2 language model as MAX modules, with Hugging Face's parameter names.

    GPT2LMHeadModel
      transformer: GPT2Model
        wte  [V, D]   token embeddings
        wpe  [P, D]   position embeddings
        h.N: Block    x + attn(ln_1(x)), then x + mlp(ln_2(x))
          ln_1, attn (CachedAttention: c_attn, c_proj), ln_2, mlp (c_fc, GELU, c_proj)
        ln_f
      lm_head [V, D]  no bias; the same tensor as wte unless the config unties them

With a packed `weight_format` (`max_gpt2.model.formats`) every projection and the LM
head are `PackedLinear`s, their weights in that format (a file's mix: each in its tensor's own),
and `wte` a `PackedEmbedding` (tied, the head's very arrays); `wpe` stays float32.

Parameter names are those of `GPT2LMHeadModel.state_dict()` in Hugging Face
(`transformer.h.0.mlp.c_fc.weight`, ..., `lm_head.weight`), with every Conv1D
weight transposed to MAX `Linear`'s `[out, in]`. Tying is the weights' business,
not the graph's: `max_gpt2.model.checkpoints.checkpoint.Checkpoint.model_weights` hands `wte`'s array
out as `lm_head.weight` too, so one compiled graph serves tied and untied models.

One call, with B = batch, S = new tokens, T = past + S, K = positions whose logits
are wanted:

    input_ids, position_ids  [B, S] int64
    attention_mask           [B, T] int64, 1 = token, 0 = padding
    logit_index              [K] int64, positions in 0..S-1
    caches                   n_layer buffers [2, B, H, M, d], written in place
    -> logits                [B, K, V] float32
    -> attentions            [L, B, H, S, T] float32, only for the `Head.ATTENTIONS` variant
                             (a separate graph: the plain one never outputs them)

For `Head.SCORES` the graph returns, instead of logits, each asked-for position's
log-probability of the token after it, `input_ids[:, k + 1]` (so every k < S - 1):

    -> logprobs              [B, K] float32, log-softmax over the vocabulary, taken in the graph

and for `Head.RANKED` also the `RANKED` likeliest tokens' log-probabilities and ids [B, K, RANKED].
`Head.HIDDEN` returns the final layer norm's output there, [B, K, D] float32, and runs no LM head.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from max.dtype import DType
from max.experimental import functional as F
from max.experimental.compilation import as_subgraph
from max.experimental.nn import Embedding, Linear, Module, ModuleList
from max.experimental.tensor import Tensor

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32, WeightFormat
from max_gpt2.model.layers.attention import GPT2Attention
from max_gpt2.model.layers.block import Block, EmbeddingFactory, LinearFactory, layer_norm
from max_gpt2.model.layers.cached_attention import CachedAttention, padding_bias
from max_gpt2.model.layers.kernel_layers import KernelCachedAttention, SkinnyLinear, block_for
from max_gpt2.model.layers.packed_linear import PackedEmbedding, PackedLinear, formats_named, take_formats
from max_gpt2.model.layers.variants import PLAIN, RANKED, Head, Variant


def linear_for(weight_format: WeightFormat, kernels: bool) -> LinearFactory:
    """The projections' module for a weight format, through the decoding kernels or MAX's ops (a mix of
    formats builds them in its `built_as`, then `take_formats` gives each its own)."""
    if weight_format.kernels_only:
        return partial(PackedLinear, format=weight_format.built_as, kernels=kernels)
    return SkinnyLinear if kernels else Linear


def embedding_for(weight_format: WeightFormat) -> EmbeddingFactory:
    """The token embedding's module for a weight format: its table packed as the head is, or float32."""
    return (
        partial(PackedEmbedding, format=weight_format.built_as) if weight_format.kernels_only else Embedding
    )


class GPT2Model(Module[..., Tensor | tuple[Tensor, Tensor]]):
    """Embeddings, the blocks and the final layer norm: token ids to hidden states [B, S, D].

    `attention()` makes each block's attention, `linear` its MLP's projections, `block` the
    block and `embedding` the token embedding (what `GPT2LMHeadModel` chooses for the graph
    variant and the weight format);
    `block_graph` names the blocks' subgraph, distinct among graphs compiled together.
    """

    def __init__(
        self,
        config: GPT2Config,
        attention: Callable[[], GPT2Attention],
        linear: LinearFactory = Linear,
        block: type[Block] = Block,
        block_graph: str = "block",
        embedding: EmbeddingFactory = Embedding,
    ) -> None:
        self.block_graph = block_graph
        self.wte = embedding(config.vocab_size, dim=config.n_embd)
        self.wpe = Embedding(config.n_positions, dim=config.n_embd)
        self.h = ModuleList(block(config, attention(), linear) for _ in range(config.n_layer))
        self.ln_f = layer_norm(config)
        self.output_attentions = self.h[0].attn.output_attentions

    def forward(
        self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor, caches: list[Tensor]
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Hidden states [B, S, D], and every layer's attention weights [L, B, H, S, T] if asked."""
        x = self.wte(input_ids) + self.wpe(position_ids)  # [B, S, D]
        key_bias = padding_bias(attention_mask, x.dtype)
        attentions = []
        for block, cache in zip(self.h, caches, strict=True):
            # Every block is one subgraph: MAX compiles the layer once, not n_layer times (once for each
            # way its projections are stored, where a file mixes formats).
            name = "_".join(filter(None, [self.block_graph, formats_named(block)]))
            out = as_subgraph(block, name=name)(x, cache, key_bias)
            x, weights = out if self.output_attentions else (out, None)
            attentions.append(weights)
        hidden = self.ln_f(x)
        return (hidden, F.stack(attentions)) if self.output_attentions else hidden


class GPT2LMHeadModel(Module[..., Tensor | tuple[Tensor, ...]]):
    """GPT-2 with its language-model head: token ids to next-token logits (and attention weights)."""

    def __init__(
        self, config: GPT2Config, variant: Variant = PLAIN, weight_format: WeightFormat = FLOAT32
    ) -> None:
        """`variant`: what the graph returns (`max_gpt2.model.layers.variants`: logits at the positions asked
        for, the next tokens' log-probabilities, the likeliest tokens' too, or attention weights) and
        whether the projections and attention run through the Mojo decoding kernels
        (`max_gpt2.kernels`; same parameters, for a few new tokens); `weight_format`: how the
        projections and the LM head are stored (`max_gpt2.model.formats`)."""
        if variant.head is Head.LAST_LOGITS:
            raise ValueError("GPT2LMHeadModel returns the positions it is asked for (logit_index)")
        kernels, self.variant = variant.kernels, variant
        self.output_attentions = variant.head is Head.ATTENTIONS
        self.ranked = min(RANKED, config.vocab_size) if variant.head is Head.RANKED else 0
        attention = KernelCachedAttention if kernels else CachedAttention
        linear = linear_for(weight_format, kernels)
        block = block_for(config, kernels)
        block_graph = (
            "kernel_block" if kernels else "block_with_weights" if self.output_attentions else "block"
        )
        self.transformer = GPT2Model(
            config,
            lambda: attention(config, self.output_attentions, linear),
            linear,
            block,
            block_graph,
            embedding_for(weight_format),
        )
        self.lm_head = linear(config.n_embd, config.vocab_size, bias=False)
        take_formats(self, weight_format)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        attention_mask: Tensor,
        logit_index: Tensor,
        *caches: Tensor,
    ) -> Tensor | tuple[Tensor, ...]:
        hidden = self.transformer(input_ids, position_ids, attention_mask, list(caches))
        hidden, attentions = hidden if self.output_attentions else (hidden, None)
        hidden = F.gather(hidden, logit_index, axis=1)  # [B, K, D]: only the rows asked for
        if self.variant.head is Head.HIDDEN:
            return F.cast(hidden, DType.float32)  # what embeddings pool: the LM head is not run
        logits = F.cast(self.lm_head(hidden), DType.float32)  # [B, K, V]
        if self.variant.scores:
            return next_token_logprobs(logits, F.gather(input_ids, logit_index + 1, axis=1), self.ranked)
        return (logits, F.cast(attentions, DType.float32)) if self.output_attentions else logits


def next_token_logprobs(logits: Tensor, targets: Tensor, ranked: int = 0) -> Tensor | tuple[Tensor, ...]:
    """log softmax(`logits` [B, K, V])[target] for `targets` [B, K] int64 -> [B, K] float32: the largest
    logit subtracted before exponentiating, the sum of exponentials reduced as it is made. With
    `ranked`, also the log-probabilities [B, K, ranked] and ids (int64) of the likeliest tokens."""
    largest = F.max(logits, axis=-1)  # [B, K, 1]
    normaliser = largest + F.log(F.sum(F.exp(logits - largest), axis=-1))  # [B, K, 1]
    picked = F.gather_nd(logits, F.unsqueeze(targets, -1), batch_dims=2)  # [B, K]
    chosen = picked - F.squeeze(normaliser, -1)
    if not ranked:
        return chosen
    best, ids = F.top_k(logits, ranked, axis=-1)  # [B, K, ranked]: the largest logits
    return chosen, best - normaliser, ids
