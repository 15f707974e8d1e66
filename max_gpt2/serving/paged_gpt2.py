"""GPT-2 over MAX's paged KV cache: the graph `max serve` runs for our architecture.

A serving batch is the new tokens of several requests laid end to end (ragged),
with `input_row_offsets` saying where each request starts. With T = tokens in
the batch, R = requests, D = n_embd, H = n_head, d = D / H:

    tokens                  [T] int64          every request's new tokens, end to end
    input_row_offsets       [R + 1] uint32     request r owns tokens offsets[r]:offsets[r+1]
    kv_collection           MAX's paged cache  keys and values of every earlier token
    positions               [T]                cache_lengths[r] + index within request r
    wte(tokens) + wpe(...)  [T, D]
    blocks (ln_1, PagedAttention, ln_2, MLP)   [T, D]
    last token of each      [R, D]             then ln_f, lm_head
    -> next_token_logits    [R, V] float32
    -> logits               [T, V] float32     every token's, only for `Head.LOGITS` (echo)

The blocks, MLP and layer norms are `max_gpt2.model`'s; only the attention
differs: it writes each token's key and value into the paged cache and attends
with MAX's ragged flash attention (`flash_attention_ragged`, causal mask), so a
decoding step reads the cache instead of recomputing the prompt. Built with
`decoding=True`, for steps where every request brings one token (or the same number:
its last token and a draft to check, `max_gpt2.serving.drafts`), each block is
one `gpt2_paged_decode_layer` op (`PagedKernelBlock`: layer norms, projections,
attention over the pages; where the MLP's activation is GELU's tanh form, else
attention through `gpt2_paged_attention`, which stores and attends in one kernel); the
pipeline model (`max_gpt2.serving.model`) compiles that graph beside the general
one on the CPU in float32, with every projection through `skinny_matmul`, and
runs whichever fits the step: a choice made once a step, not one graph branch a
layer. Parameter names are Hugging Face's, as in `max_gpt2.model.GPT2LMHeadModel`,
so the same weights bind.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from max import tree
from max.driver import CPU
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.nn import Embedding, Linear, Module, ModuleList
from max.experimental.nn.common_layers.functional_kernels import flash_attention_ragged
from max.experimental.tensor import Tensor
from max.graph import BufferValue, TensorValue
from max.nn.attention import MHAMaskVariant
from max.nn.kernels import store_k_cache_ragged, store_v_cache_ragged
from max.nn.kv_cache import KVCacheInputsPerDevice, KVCacheParams, PagedCacheValues
from max.pipelines.lib import ModuleV3Outputs

from max_gpt2.kernels import paged_attention, paged_decode_layer
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.layers.attention import GPT2Attention
from max_gpt2.model.layers.block import EmbeddingFactory, LinearFactory, layer_norm
from max_gpt2.model.layers.kernel_layers import KernelBlock, block_for
from max_gpt2.model.layers.variants import LAST_LOGITS, Head, Variant

_store_keys = F.functional(store_k_cache_ragged)
_store_values = F.functional(store_v_cache_ragged)


class PagedAttention(GPT2Attention):
    """GPT-2 attention over ragged tokens and MAX's paged KV cache; same parameters as `GPT2Attention`.

    Built with `decoding` (only for steps whose requests each bring one token) it
    runs `gpt2_paged_attention`, which stores and attends in one pass over each
    request's pages; otherwise MAX's store and flash attention.
    """

    def __init__(
        self,
        config: GPT2Config,
        kv_params: KVCacheParams,
        layer_idx: int,
        linear: LinearFactory = Linear,
        decoding: bool = False,
    ) -> None:
        super().__init__(config, linear=linear)
        self.kv_params = kv_params
        self.layer_idx = layer_idx
        self.decoding = decoding

    def forward(  # type: ignore[override]
        self, x: Tensor, kv_collection: PagedCacheValues, input_row_offsets: Tensor
    ) -> Tensor:
        """`x` [T, D] -> [T, D]; stores this layer's keys and values for the T tokens in the cache."""
        qkv = self.c_attn(x)  # [T, 3D]
        if self.decoding:
            return self.c_proj(paged_attention(kv_collection, qkv, input_row_offsets, self.layer_idx))
        return self.c_proj(self._flash_attention(qkv, kv_collection, input_row_offsets))

    def _flash_attention(
        self, qkv: Tensor, kv_collection: PagedCacheValues, input_row_offsets: Tensor
    ) -> Tensor:
        """MAX's ops: `qkv` [T, 3D] into the cache, each token attending over its request's past -> [T, D]."""
        heads = [-1, self.n_head, self.head_dim]
        query, key, value = (t.reshape(heads) for t in F.split(qkv, [self.n_embd] * 3, axis=-1))
        layer = F.constant(self.layer_idx, DType.uint32, device=CPU())
        _store_keys(kv_collection, key, input_row_offsets, layer)
        _store_values(kv_collection, value, input_row_offsets, layer)
        attended = flash_attention_ragged(  # [T, H, d]
            self.kv_params,
            input=query,
            input_row_offsets=input_row_offsets,
            kv_collection=kv_collection,
            layer_idx=layer,
            mask_variant=MHAMaskVariant.CAUSAL_MASK,
            scale=1 / math.sqrt(self.head_dim),
        )
        return attended.reshape([-1, self.n_embd])


class PagedKernelBlock(KernelBlock):
    """`KernelBlock` over MAX's paged cache: one `gpt2_paged_decode_layer` op, for decoding steps.

    Its attention is a `PagedAttention` (for its layer index and parameters) and its
    projections anything with `stored()` (`KernelLinear`, `PackedLinear`).
    """

    def forward(self, x: Tensor, kv_collection: PagedCacheValues, input_row_offsets: Tensor) -> Tensor:  # type: ignore[override]
        """`x` [R * S, D], S tokens a request (1 but in a step checking drafts) -> [R * S, D]; stores this
        layer's keys and values in the cache."""
        layer = self.attn.layer_idx  # type: ignore[attr-defined]
        return paged_decode_layer(x, kv_collection, input_row_offsets, layer, self.layer_parameters())


def graph_value(x: Tensor) -> TensorValue | BufferValue:
    """The value `x` (a graph input, on one device) stands for in the graph being built."""
    (value,) = x.graph_values
    return value


def ragged_positions(input_row_offsets: Tensor, cache_lengths: Tensor, total: int | str) -> Tensor:
    """The absolute position of each of the `total` tokens: [T] int64.

    Token t of request r sits at `cache_lengths[r] + t - offsets[r]`; r is the
    number of requests that end at or before t.
    """
    offsets = F.cast(input_row_offsets, DType.int64)  # [R + 1]
    index = F.arange(0, total, 1, total, dtype=DType.int64, device=offsets.device)  # [T]
    ends = offsets[1:]
    request = F.sum(F.cast(index.reshape([-1, 1]) >= ends.reshape([1, -1]), DType.int64), axis=-1)
    request = request.reshape([-1])  # [T]
    past = F.cast(cache_lengths, DType.int64)
    return index - F.gather(offsets, request, axis=0) + F.gather(past, request, axis=0)


class PagedGPT2Model(Module[..., Tensor]):
    """Embeddings and the blocks over the paged cache: [T] ids -> [T, D], before `ln_f`.

    `layer(i)` makes block i (`PagedGPT2LMHeadModel` picks its kind and projections), `embedding`
    the token embedding. `ln_f` lives here for its parameter name (`transformer.ln_f`); the head
    applies it to the rows whose logits it computes.
    """

    def __init__(
        self, config: GPT2Config, layer: Callable[[int], Module], embedding: EmbeddingFactory
    ) -> None:
        self.wte = embedding(config.vocab_size, dim=config.n_embd)
        self.wpe = Embedding(config.n_positions, dim=config.n_embd)
        self.h = ModuleList(layer(index) for index in range(config.n_layer))
        self.ln_f = layer_norm(config)

    def forward(self, tokens: Tensor, kv_collection: PagedCacheValues, input_row_offsets: Tensor) -> Tensor:
        positions = ragged_positions(input_row_offsets, kv_collection.cache_lengths, tokens.shape[0])
        x = self.wte(tokens) + self.wpe(positions)  # [T, D]
        for block in self.h:
            x = block(x, kv_collection, input_row_offsets)
        return x


class PagedGPT2LMHeadModel(Module[..., ModuleV3Outputs]):
    """GPT-2 with its head, in the calling convention of MAX's ModuleV3 pipelines.

    `forward(tokens, return_n_logits, input_row_offsets, *kv_inputs)`: the KV
    cache arrives flattened, as MAX's batch processor lays it out. Its `variant`
    (`max_gpt2.model.layers.variants`) says what comes out: `Head.LOGITS` (a server started
    with `--enable-echo`) every token's logits too, for the prompt's log-probabilities,
    the last of each request's the next-token logits; `Head.LAST_LOGITS` those alone.
    `linear` makes the projections and the head, `embedding` the token embedding. Through the
    kernels (for steps where each request brings one token, or its last and a draft) the graph
    returns every token's logits as the next-token logits, gathered from neither the hidden
    states nor the logits (MAX's gather of an [R, V] copy costs every step: docs/performance.md),
    and `PagedAttention` takes its decoding kernel.
    """

    def __init__(
        self,
        config: GPT2Config,
        kv_params: KVCacheParams,
        variant: Variant = LAST_LOGITS,
        linear: LinearFactory = Linear,
        embedding: EmbeddingFactory = Embedding,
    ) -> None:
        if variant.head not in (Head.LAST_LOGITS, Head.LOGITS):
            raise ValueError(
                f"the server's GPT-2 returns the last token's logits or every token's, not {variant}"
            )
        decoding = variant.kernels
        self.kv_params, self.every_token, self.decoding = kv_params, variant.head is Head.LOGITS, decoding
        block = block_for(config, decoding, PagedKernelBlock)  # one op a block where it fits

        def layer(index: int) -> Module:
            return block(config, PagedAttention(config, kv_params, index, linear, decoding), linear)

        self.transformer = PagedGPT2Model(config, layer, embedding)
        self.lm_head = linear(config.n_embd, config.vocab_size, bias=False)

    def forward(
        self, tokens: Tensor, return_n_logits: Tensor, input_row_offsets: Tensor, *kv_inputs: Tensor
    ) -> ModuleV3Outputs:
        del return_n_logits  # the pipeline model picks a graph by it; each graph returns what it was built to
        caches = self.kv_params.unflatten_kv_inputs(graph_value(x) for x in kv_inputs)
        kv_collection = tree.leaves(caches, leaf=KVCacheInputsPerDevice)[0]
        hidden = self.transformer(tokens, kv_collection, input_row_offsets)  # [T, D]
        if self.decoding:  # T == R, or S tokens a request in a step checking drafts
            return ModuleV3Outputs(next_token_logits=self.logits(hidden))
        last_rows = input_row_offsets[1:] - 1  # [R]
        if self.every_token:
            logits = self.logits(hidden)  # [T, V]
            last = F.gather(logits, last_rows, axis=0)  # [R, V]
            return ModuleV3Outputs(next_token_logits=last, logits=logits, logit_offsets=input_row_offsets)
        return ModuleV3Outputs(next_token_logits=self.logits(F.gather(hidden, last_rows, axis=0)))  # [R, V]

    def logits(self, hidden: Tensor) -> Tensor:
        """[rows, D] hidden states -> [rows, V] float32 logits (ln_f, then the head)."""
        return F.cast(self.lm_head(self.transformer.ln_f(hidden)), DType.float32)
