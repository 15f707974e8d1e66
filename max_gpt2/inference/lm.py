"""The compiled GPT-2 language model: logits, and the steps generation is made of, from token ids.

    lm = load_lm("path/to/gpt2", device="auto", dtype="float32")   # read, check, compile, bind
    logits = lm.logits(input_ids, attention_mask)                  # float32 [batch, seq, vocab]
    cache = lm.new_cache(batch, max_length)                        # KV cache for prompt + new tokens
    logits = lm.prefill(input_ids, cache, attention_mask)          # float32 [batch, vocab], last position
    logits = lm.decode_step(tokens, cache)                         # tokens [batch] -> [batch, vocab]
    lm.reorder_cache(cache, rows, kept)                            # row b takes row rows[b]'s, in place
    out = lm.generate(input_ids, max_new_tokens=20)                # int64 [batch, seq + 20]
    lp = lm.logprobs(input_ids, attention_mask)                    # float32 [batch, seq], NaN at first
    result = lm.perplexity("text", stride=512)                     # Perplexity: nll, perplexity, bits/byte
    weights = lm.attentions(input_ids, attention_mask)             # float32 [layers, batch, heads, seq, seq]
    hidden = lm.hidden_states(input_ids, attention_mask)           # float32 [batch, seq, n_embd]

One graph (`max_gpt2.model.layers.gpt2.GPT2LMHeadModel`, every length symbolic) serves
every prompt, and one more every decoding step, so nothing a user passes
triggers a compile. On the CPU in float32 the step graph runs the same modules
through the Mojo decoding kernels (`max_gpt2.kernels`), which stream each weight
and the cache once per step; elsewhere the prompt graph serves the steps too.
A `KVCache` holds one buffer per layer, sized for prompt plus new tokens, written
in place by the graphs: a step reads the cache, never copies it. It is in the
compute dtype, or in float16 (`kv_cache="float16"` with float32 compute, and by
default beside packed weights), as llama.cpp keeps its own.

Padding follows Hugging Face's `generate`: prompts are left-padded, `attention_mask`
marks real tokens with 1, padding is never attended to, and positions count real
tokens only. Generation (`lm.generate`, `lm.stream`) is written in
`max_gpt2.inference.generation` on `prefill`, `decode_step` and `reorder_cache`;
scoring (`lm.score`, `lm.logprobs`, `lm.perplexity`) in `max_gpt2.inference.scoring`.
`compile_lm` and `load_lm` (`max_gpt2.inference.loading`) check every option once
(`max_gpt2.inference.lm_options`), then compile and bind the weights. Attention weights and
hidden states come from variants of the graph, each compiled the first time it is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
from max.driver import CPU, Buffer
from max.dtype import DType
from tokenizers import Tokenizer

from max_gpt2.inference import generation, scoring
from max_gpt2.inference.compiled import CompiledModel
from max_gpt2.inference.constraints import GrammarEngines
from max_gpt2.inference.devices import gpu_of, weight_buffers
from max_gpt2.inference.kv_cache import KVCache
from max_gpt2.inference.lm_graphs import LMGraphs
from max_gpt2.inference.prompts import check_left_padding, check_prompt, check_tokens, position_ids
from max_gpt2.model.checkpoints.stored_weights import check_lm_weights
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import WeightFormat
from max_gpt2.model.gpu_limits import check_attention_weights
from max_gpt2.model.layers.variants import ATTENTIONS, REORDER, Variant

if TYPE_CHECKING:
    from typing_extensions import Unpack


class CompiledLM(CompiledModel):
    """GPT-2 compiled for one device and dtype, with one checkpoint's weights bound.

    `tokenizer` is the checkpoint's where `load_lm` found one (None otherwise,
    and after `with_weights`); `perplexity` reads text with it. `grammars` makes the
    engines constraints need, each once (`max_gpt2.inference.constraints`). `weight_format`
    is how the projections and the LM head are stored (`max_gpt2.model.formats`):
    the float32 weights bound are packed into it here. `kv_dtype` is the KV cache's
    dtype: the compute dtype, or float16 (`kv_cache="float16"`).
    """

    graph: LMGraphs
    tokenizer: Tokenizer | None = None

    @cached_property
    def grammars(self) -> GrammarEngines:
        return GrammarEngines(self.config.vocab_size)

    @property
    def weight_format(self) -> WeightFormat:
        return self.graph.options.weight_format

    @property
    def kv_dtype(self) -> DType:
        return self.graph.options.kv_dtype

    def describe(self) -> dict[str, Any]:
        c = self.config
        fields = {"n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head, "vocab_size": c.vocab_size}
        fields |= self.placement()
        if self.weight_format.kernels_only:
            fields["weight_format"] = self.weight_format.name
        if self.weight_format.kernels_only or self.kv_dtype != self.dtype:  # as the CLI names it
            fields["kv_cache"] = self.kv_dtype.name
        return fields

    def check_weights(self, weights: Mapping[str, Any], config: GPT2Config) -> Mapping[str, np.ndarray]:
        """`check_lm_weights` for this model's weight format."""
        return check_lm_weights(weights, config, self.weight_format)

    def buffers(self, weights: Mapping[str, Any]) -> dict[str, Buffer]:
        """The weights packed into `weight_format`, the rest in the compute dtype (`weight_buffers`)."""
        return weight_buffers(weights, self.weight_format, self.dtype)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KV cache for `batch` rows of up to `capacity` positions (prompt, padding, new tokens)."""
        limit = self.config.n_positions
        for name, value, most in (("batch", batch, None), ("capacity", capacity, limit)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            if most is not None and value > most:
                raise ValueError(
                    f"a cache of {value} positions is longer than the model's n_positions={most}"
                )
        c = self.config
        shape = (2, int(batch), c.n_head, int(capacity), c.head_dim)
        return KVCache([Buffer(self.kv_dtype, shape, self.device) for _ in range(c.n_layer)], batch, capacity)

    def prefill(
        self, input_ids: Any, cache: KVCache, attention_mask: Any = None, all_logits: bool = False
    ) -> np.ndarray:
        """Runs a prompt `[batch, seq]` into the empty `cache`; its last logits, float32 `[batch, vocab]`.

        With `all_logits`, every position's logits, `[batch, seq, vocab]` (padding
        positions get logits too; nothing real depends on them). Where the cache
        has room for new tokens after the prompt, padding must be on the left.
        """
        ids, mask = check_prompt(self.config, input_ids, attention_mask)
        batch, seq_len = ids.shape
        if cache.length:
            raise ValueError(f"prefill needs an empty cache; this one holds {cache.length} positions")
        if batch != cache.batch or seq_len > cache.capacity:
            raise ValueError(
                f"a prompt of shape [{batch}, {seq_len}] does not fit a cache of "
                f"{cache.batch} rows and {cache.capacity} positions"
            )
        if seq_len < cache.capacity:  # new tokens will follow each row's last one
            check_left_padding(mask)
        cache.attention_mask = mask
        logit_index = np.arange(seq_len) if all_logits else np.array([seq_len - 1])
        logits = self._run(self.graph.prompt_variant, ids, position_ids(mask), mask, logit_index, cache)
        return logits if all_logits else logits[:, 0]

    def decode_step(self, tokens: Any, cache: KVCache) -> np.ndarray:
        """Appends one token per row, int `[batch]`, to `cache`; the next logits, float32 `[batch, vocab]`."""
        return self._append(check_tokens(self.config, tokens, cache.batch)[:, None], cache)[:, 0]

    def extend(self, tokens: Any, cache: KVCache) -> np.ndarray:
        """Appends S tokens per row, int `[batch, S]`, to `cache` after the positions it holds; the logits
        after each, float32 `[batch, S, vocab]`: what S `decode_step`s give, in one pass over the weights
        (the same graph; each token attends to those before it). Speculative decoding checks S drafted
        tokens so, and drops the rejected ones after (`KVCache.truncate`)."""
        return self._append(check_tokens(self.config, tokens, cache.batch, per_row=True), cache)

    def _append(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """`extend` on tokens already checked, int64 `[batch, S]`."""
        new = tokens.shape[1]
        if cache.length == 0:
            raise ValueError("decoding needs a cache that holds a prompt: call prefill first")
        if cache.length + new > cache.capacity:
            if cache.length == cache.capacity:
                raise ValueError(f"the cache is full: all {cache.capacity} positions are written")
            raise ValueError(
                f"{new} tokens do not fit the cache: {cache.length} of {cache.capacity} positions are written"
            )
        positions = cache.next_positions() + np.arange(new)
        cache.attention_mask = np.concatenate(
            [cache.attention_mask, np.ones((cache.batch, new), np.int64)], axis=1
        )
        return self._run(
            self.graph.step_variant, tokens, positions, cache.attention_mask, np.arange(new), cache
        )

    def reorder_cache(self, cache: KVCache, rows: Any, kept: Any = None) -> None:
        """Row b of `cache` takes row `rows[b]`'s keys, values and mask (int [batch]), in place on the
        device (beam search; the `REORDER` graph, compiled on first use). `kept` (int [batch]) says
        how many first positions of each row already hold what its new source holds (the same
        tokens: beam search knows), which are not copied; rows that stay are not touched."""
        if (moved := cache.reorder(rows, kept)) is not None:  # (rows, kept) as int64
            self._bound.execute(REORDER, *self._inputs(*moved, cache.attention_mask), *cache.buffers)

    def logits(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """Next-token logits at every position, float32 `[batch, seq, vocab]` (padding's too)."""
        ids, mask = check_prompt(self.config, input_ids, attention_mask)
        return self.prefill(ids, self.new_cache(*ids.shape), mask, all_logits=True)

    def hidden_states(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """The final layer norm's output at every position, float32 `[batch, seq, n_embd]`: Hugging Face's
        `GPT2Model(...).last_hidden_state`, which embeddings pool (`max_gpt2.inference.embeddings`)."""
        ids, mask = check_prompt(self.config, input_ids, attention_mask)
        cache, every = self.new_cache(*ids.shape), np.arange(ids.shape[1])
        return self._run(self.graph.hidden, ids, position_ids(mask), mask, every, cache)

    def attentions(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """The weights every head of every layer gives every key, float32 `[layers, batch, heads, seq, seq]`.

        `[l, b, h, i]` is the softmax row of query i: it sums to 1 over the keys that query may see and
        is exactly 0 on the rest (later positions and padding; a padding query's row is all 0). The
        first call compiles the graph variant that outputs the weights (a minute or two on a small CPU;
        MAX caches it on disk). Refused in bfloat16 on NVIDIA Hopper, where MAX 26.7 gets them wrong
        (`gpu_limits.hopper_attention_weights_refusal`).
        """
        return self._attentions(input_ids, attention_mask, every_position=False)[1]

    def logits_and_attentions(
        self, input_ids: Any, attention_mask: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`logits` and `attentions` of the same forward pass: float32 `[batch, seq, vocab]` and
        `[layers, batch, heads, seq, seq]` (what the head explorer shows side by side)."""
        return self._attentions(input_ids, attention_mask, every_position=True)

    def _attentions(
        self, input_ids: Any, attention_mask: Any, every_position: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        check_attention_weights(gpu_of(self.device), self.dtype)
        ids, mask = check_prompt(self.config, input_ids, attention_mask)
        batch, seq_len = ids.shape
        cache = self.new_cache(batch, seq_len)
        logit_index = np.arange(seq_len) if every_position else np.array([seq_len - 1])
        inputs = self._inputs(ids, position_ids(mask), mask, logit_index)
        logits, weights = self._bound.execute(ATTENTIONS, *inputs, *cache.buffers)
        real_queries = mask[None, :, None, :, None].astype(np.float32)  # [1, B, 1, S, 1]
        return np.from_dlpack(logits.to(CPU())), np.from_dlpack(weights.to(CPU())) * real_queries

    def next_token_logprobs(self, ids: np.ndarray, mask: np.ndarray, first: int, ranked: bool = False) -> Any:
        """log p(ids[:, t] | ids[:, :t]) for t = first..S-1 through the scoring graph, float32
        `[batch, S - first]`; `ids` [batch, S] checked, `first` >= 1. The LM head runs over those
        positions only. With `ranked`, also the `RANKED` likeliest tokens' log-probabilities (float32)
        and ids (int64) at each, `[batch, S - first, RANKED]`, in no particular order."""
        batch, seq_len = ids.shape
        logit_index = np.arange(first - 1, seq_len - 1)  # position t - 1 predicts token t
        cache = self.new_cache(batch, seq_len)
        variant = self.graph.scoring(ranked)
        return self._run(variant, ids, position_ids(mask), mask, logit_index, cache)

    # Generation and scoring are written on the steps above (`max_gpt2.inference.generation`,
    # `max_gpt2.inference.scoring`); each method says what it returns.

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        attention_mask: Any = None,
        **options: Unpack[generation.GenerationOptions],
    ) -> np.ndarray:
        """The prompts and their new tokens, int64 `[batch x n, seq + new]`: Hugging Face's `generate`
        (greedy, sampling, beam search; `max_gpt2.inference.generation.generate`)."""
        return generation.generate(self, input_ids, max_new_tokens, attention_mask, **options)

    def stream(
        self,
        input_ids: Any,
        max_new_tokens: int,
        attention_mask: Any = None,
        **options: Unpack[generation.StreamOptions],
    ) -> generation.Stream:
        """Each new token per row as soon as it is chosen (`max_gpt2.inference.generation.stream`)."""
        return generation.stream(self, input_ids, max_new_tokens, attention_mask, **options)

    def score(self, input_ids: Any, attention_mask: Any = None, top_k: int = 0) -> scoring.Scores:
        """Every token's log-probability, and the `top_k` likeliest at each position
        (`max_gpt2.inference.scoring.score`)."""
        return scoring.score(self, input_ids, attention_mask, top_k)

    def logprobs(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """Each token's log-probability given the tokens before it, float32 `[batch, seq]` (NaN: none)."""
        return scoring.logprobs(self, input_ids, attention_mask)

    def perplexity(
        self,
        text_or_ids: str | Any,
        stride: int | None = None,
        tokenizer: Tokenizer | None = None,
        progress: Callable[[int, int], None] | None = None,
        chunks: bool = False,
    ) -> scoring.Perplexity:
        """The perplexity of a text or of token ids, in windows (`max_gpt2.inference.scoring.perplexity`)."""
        return scoring.perplexity(self, text_or_ids, stride, tokenizer, progress, chunks)

    def _run(
        self,
        variant: Variant,
        ids: np.ndarray,
        positions: np.ndarray,
        mask: np.ndarray,
        logit_index: np.ndarray,
        cache: KVCache,
    ) -> Any:
        """One call of a graph variant: logits float32 [batch, len(logit_index), vocab] for the new tokens
        (the scoring variants: their outputs, a tuple where there are several)."""
        inputs = self._inputs(ids, positions, mask, logit_index)
        outputs = [np.from_dlpack(o.to(CPU())) for o in self._bound.execute(variant, *inputs, *cache.buffers)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _inputs(self, *arrays: np.ndarray) -> list[Buffer]:
        """The graph's integer inputs on the device: ids, positions, mask, logit_index."""
        return [Buffer.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device) for a in arrays]
