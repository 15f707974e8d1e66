"""The compiled GPT-2 language model: next-token logits, generation and streaming from token ids.

    lm = load_lm("path/to/gpt2", device="auto", dtype="float32")   # read, adapt, compile, bind
    logits = lm.logits(input_ids, attention_mask)                  # float32 [batch, seq, vocab]
    out = lm.generate(input_ids, max_new_tokens=20)                # int64 [batch, seq + 20]
    for tokens, logits in lm.stream(input_ids, 20): ...            # [batch] and [batch, vocab] a step
    weights = lm.attentions(input_ids, attention_mask)             # float32 [layers, batch, heads, seq, seq]

One graph (`max_gpt2.model.GPT2LMHeadModel`, every length symbolic) serves
every prompt, and one more every decoding step, so nothing a user passes
triggers a compile. On the CPU in float32 the step graph runs the same modules
through the Mojo decoding kernels (`max_gpt2.kernels`), which stream each weight
and the cache once per step; elsewhere the prompt graph serves the steps too.
Generation allocates one KV cache buffer per layer, sized for prompt plus new
tokens, and the graphs write each step's keys and values into it in place: a
step computes one token per row and reads the cache, never copies it.

Padding follows Hugging Face's `generate`: a batch of prompts of different lengths
is left-padded, `attention_mask` marks real tokens with 1, padding is never
attended to, and positions count real tokens only.

Attention weights come from a variant of the graph that also outputs them
(`output_attentions=True`), compiled the first time `attentions` is called: the
plain graph, which everything else runs, never carries them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from max.driver import CPU, Buffer, Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import TensorType, default_device, default_dtype
from max.graph import BufferType, DeviceRef, Graph

from max_gpt2.compiled import BoundVariants, GraphVariants
from max_gpt2.config import GPT2Config
from max_gpt2.devices import device_name, resolve_device, to_buffer
from max_gpt2.dtypes import parse_dtype
from max_gpt2.inputs import check_generation, check_prompt, int_array, position_ids
from max_gpt2.kernels import kernels_run_on
from max_gpt2.model import GPT2LMHeadModel
from max_gpt2.sampling import Sampler
from max_gpt2.weights import Checkpoint, check_model_weights


class Step(NamedTuple):
    """One generated token per row, and the logits it was chosen from."""

    tokens: np.ndarray  # int64 [batch]
    logits: np.ndarray  # float32 [batch, vocab]


class CompiledLM:
    """GPT-2 compiled for one device and dtype, with one checkpoint's weights bound."""

    def __init__(
        self,
        config: GPT2Config,
        device: Device,
        dtype: DType,
        graph: LMGraphs,
        weights: Mapping[str, np.ndarray],
    ) -> None:
        """Binds `weights` (already checked by `check_model_weights`) to the compiled graphs."""
        self.config, self.device, self.dtype, self.graph = config, device, dtype, graph
        # A tied LM head is the same array as wte: convert it once and bind it under both names.
        converted: dict[int, Buffer] = {}
        for array in weights.values():
            if id(array) not in converted:
                converted[id(array)] = to_buffer(array, dtype, CPU())
        self._bound = BoundVariants(graph, {name: converted[id(array)] for name, array in weights.items()})

    def with_weights(self, weights: Mapping[str, np.ndarray]) -> CompiledLM:
        """The same compiled graph with another checkpoint's weights (same shapes); no recompile."""
        checked = check_model_weights(weights, self.config)
        return CompiledLM(self.config, self.device, self.dtype, self.graph, checked)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"CompiledLM(n_layer={c.n_layer}, n_embd={c.n_embd}, n_head={c.n_head}, "
            f"vocab_size={c.vocab_size}, device={device_name(self.device)!r}, dtype={self.dtype.name!r})"
        )

    def logits(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """Next-token logits at every position, float32 `[batch, seq, vocab]`.

        Padding positions (mask 0) get logits too; nothing real depends on them.
        """
        ids, mask = check_prompt(self.config, input_ids, attention_mask)
        batch, seq_len = ids.shape
        caches = self._new_cache(batch, seq_len)
        return self._run(ids, position_ids(mask), mask, np.arange(seq_len), caches)

    def attentions(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """The weights every head of every layer gives every key, float32 `[layers, batch, heads, seq, seq]`.

        `[l, b, h, i]` is the softmax row of query i: it sums to 1 over the keys
        that query may see and is exactly 0 on the rest (later positions and
        padding). A padding query sees nothing, so its row is all 0. The first
        call compiles the graph variant that outputs the weights (a minute or two
        on a small CPU; MAX caches it on disk, so the next process takes seconds).
        """
        ids, mask = check_prompt(self.config, input_ids, attention_mask)
        batch, seq_len = ids.shape
        inputs = self._inputs(ids, position_ids(mask), mask, np.array([seq_len - 1]))
        model = self._bound.model("attentions")
        _, weights = model.execute(*inputs, *self._new_cache(batch, seq_len))
        real_queries = mask[None, :, None, :, None].astype(np.float32)  # [1, B, 1, S, 1]
        return np.from_dlpack(weights.to(CPU())) * real_queries

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        attention_mask: Any = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> np.ndarray:
        """The prompt followed by `max_new_tokens` new tokens per row, int64 `[batch, seq + new]`.

        Greedy unless `do_sample`; sampling with the same `seed` gives the same
        tokens. A row that produces `eos_token_id` produces it from then on, and
        once every row has, the rest is filled with it without running the model.
        """
        steps = self.stream(
            input_ids,
            max_new_tokens,
            attention_mask,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            eos_token_id=eos_token_id,
        )
        ids = int_array(input_ids, "input_ids")
        new = np.stack([step.tokens for step in steps], axis=1)  # [batch, steps run]
        if new.shape[1] < max_new_tokens:  # every row finished early: the rest is end-of-text
            rest = np.full((ids.shape[0], max_new_tokens - new.shape[1]), eos_token_id, dtype=np.int64)
            new = np.concatenate([new, rest], axis=1)
        return np.concatenate([ids, new], axis=1)

    def stream(
        self,
        input_ids: Any,
        max_new_tokens: int,
        attention_mask: Any = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> Iterator[Step]:
        """Generates as `generate` does, yielding each `Step` as soon as it is chosen.

        Every argument is checked here, before the first step runs. The
        iteration ends after `max_new_tokens` steps, or earlier once every row
        has produced `eos_token_id`.
        """
        check_generation(self.config, max_new_tokens, eos_token_id)
        sampler = Sampler(do_sample, temperature, top_k, top_p, seed)
        ids, mask = check_prompt(self.config, input_ids, attention_mask, int(max_new_tokens))
        return self._steps(ids, mask, int(max_new_tokens), sampler, eos_token_id)

    def _steps(
        self, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, sampler: Sampler, eos: int | None
    ) -> Iterator[Step]:
        batch, seq_len = ids.shape
        caches = self._new_cache(batch, seq_len + max_new_tokens)
        positions = position_ids(mask)
        rng = sampler.generator()
        finished = np.zeros(batch, dtype=bool)
        logits = self._run(ids, positions, mask, np.array([seq_len - 1]), caches)[:, 0]  # the prompt
        variant = self.graph.step_variant
        for step in range(max_new_tokens):
            tokens = sampler(logits, rng)
            if eos is not None:
                tokens = np.where(finished, eos, tokens)
                finished |= tokens == eos
            yield Step(tokens, logits)
            if step == max_new_tokens - 1 or finished.all():
                return
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            positions = positions[:, -1:] + 1
            logits = self._run(tokens[:, None], positions, mask, np.array([0]), caches, variant)[:, 0]

    def _new_cache(self, batch: int, length: int) -> list[Buffer]:
        """One uninitialised [2, batch, H, length, d] buffer per layer: each step writes before it reads."""
        c = self.config
        shape = (2, batch, c.n_head, length, c.head_dim)
        return [Buffer(self.dtype, shape, self.device) for _ in range(c.n_layer)]

    def _run(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        mask: np.ndarray,
        logit_index: np.ndarray,
        caches: list[Buffer],
        variant: str = "plain",
    ) -> np.ndarray:
        """One call of a graph variant: logits float32 [batch, len(logit_index), vocab] for the new tokens."""
        inputs = self._inputs(ids, positions, mask, logit_index)
        (logits,) = self._bound.model(variant).execute(*inputs, *caches)
        return np.from_dlpack(logits.to(CPU()))

    def _inputs(self, *arrays: np.ndarray) -> list[Buffer]:
        """The graph's integer inputs on the device: ids, positions, mask, logit_index."""
        return [Buffer.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device) for a in arrays]


def compile_lm(
    config: GPT2Config,
    weights: Mapping[str, np.ndarray],
    device: str | Device = "auto",
    dtype: str | DType = "float32",
    output_attentions: bool = False,
) -> CompiledLM:
    """Compiles GPT-2 for `device` and `dtype` and binds `weights` (`Checkpoint.model_weights()`).

    The graphs compiled now are those `generate` runs (the prompt's and the
    steps'), or with `output_attentions` only the variant that
    `CompiledLM.attentions` runs (for a caller that wants only attention
    weights); any other is compiled the first time it is needed.
    """
    target, compute_dtype = resolve_device(device), parse_dtype(dtype)
    checked = check_model_weights(weights, config)  # before spending time compiling
    graph = LMGraphs(config, target, compute_dtype)
    for variant in ["attentions"] if output_attentions else ["plain", graph.step_variant]:
        graph.compiled(variant)
    return CompiledLM(config, target, compute_dtype, graph, checked)


class LMGraphs(GraphVariants):
    """GPT-2's graph variants for one config, device and dtype: `"plain"`, `"attentions"`, `"decode"`.

    `"decode"` is the plain graph with the Mojo decoding kernels, staged only
    where they run (`kernels_run_on`); `step_variant` names the variant that
    runs decoding steps here.
    """

    def __init__(self, config: GPT2Config, device: Device, dtype: DType) -> None:
        super().__init__(device, self._trace)
        self.config, self.device, self.dtype = config, device, dtype
        self.step_variant = "decode" if kernels_run_on(device, dtype) else "plain"

    def _trace(self, variant: str) -> Graph:
        config, device = self.config, self.device
        with F.lazy(), default_device(device), default_dtype(self.dtype):
            # lazy: random initial weights are never made
            module = GPT2LMHeadModel(config, variant == "attentions", kernels=variant == "decode")
        tokens = TensorType(DType.int64, ["batch", "seq"], device=device)
        mask = TensorType(DType.int64, ["batch", "total"], device=device)
        logit_index = TensorType(DType.int64, ["logits"], device=device)
        device_ref = DeviceRef.from_device(device)
        cache = BufferType(self.dtype, [2, "batch", config.n_head, "max_len", config.head_dim], device_ref)
        inputs = [tokens, tokens, mask, logit_index, *[cache] * config.n_layer]
        return module.trace(*inputs, name=f"GPT2LMHeadModel_{variant}").graph


def load_lm(
    checkpoint: str | Path, device: str | Device = "auto", dtype: str | DType = "float32"
) -> CompiledLM:
    """Reads a GPT-2 safetensors checkpoint (path or Hub id), compiles the model and binds its weights."""
    opened = Checkpoint(checkpoint)
    return compile_lm(opened.config, opened.model_weights(), device, dtype)
