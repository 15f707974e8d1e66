"""What generation and scoring ask of a compiled language model (`CompiledLM` is one): its steps.

    cache = lm.new_cache(batch, capacity)             # KV cache for prompt + new tokens
    logits = lm.prefill(input_ids, cache, mask)       # float32 [batch, vocab], the last position
    logits = lm.decode_step(tokens, cache)            # tokens [batch] -> [batch, vocab]
    logits = lm.extend(tokens, cache)                 # tokens [batch, S] -> [batch, S, vocab]
    lm.reorder_cache(cache, rows, kept)               # beam search: row b takes row rows[b]'s
    lp = lm.next_token_logprobs(ids, mask, first)     # scoring graph: float32 [batch, seq - first]

`max_gpt2.inference.generation` and `max_gpt2.inference.scoring` are written on these alone, so
they need not import the model they serve.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.inference.constraints import GrammarEngines
from max_gpt2.inference.kv_cache import KVCache
from max_gpt2.model.config import GPT2Config


class Steps(Protocol):
    """A compiled language model's steps (module docstring)."""

    config: GPT2Config
    tokenizer: Tokenizer | None
    grammars: GrammarEngines  # constraints' engines, each made once (`max_gpt2.inference.constraints`)

    def new_cache(self, batch: int, capacity: int) -> KVCache: ...

    def prefill(
        self, input_ids: Any, cache: KVCache, attention_mask: Any = None, all_logits: bool = False
    ) -> np.ndarray: ...

    def decode_step(self, tokens: Any, cache: KVCache) -> np.ndarray: ...

    def extend(self, tokens: Any, cache: KVCache) -> np.ndarray: ...

    def reorder_cache(self, cache: KVCache, rows: Any, kept: Any = None) -> None: ...

    def next_token_logprobs(
        self, ids: np.ndarray, mask: np.ndarray, first: int, ranked: bool = False
    ) -> Any: ...
