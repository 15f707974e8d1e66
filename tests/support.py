"""Shapes, inputs and helpers shared by the tests."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from max.driver import accelerator_count

from max_gpt2 import CompiledLM, GPT2Config
from max_gpt2.cli.serve import SERVE_MODULES, missing_modules
from max_gpt2.model.formats.block_quants import BLOCK
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits

# Head layouts of the released GPT-2 sizes, a single head, and small odd shapes.
GPT2_SMALL = GPT2Config(n_embd=768, n_head=12)
GPT2_MEDIUM = GPT2Config(n_embd=1024, n_head=16)
GPT2_LARGE = GPT2Config(n_embd=1280, n_head=20)
GPT2_XL = GPT2Config(n_embd=1600, n_head=25)
SINGLE_HEAD = GPT2Config(n_embd=48, n_head=1, n_layer=2, n_positions=256, vocab_size=97)
ODD = GPT2Config(n_embd=60, n_head=5, n_layer=3, n_positions=256, vocab_size=97)  # head_dim 12
TINY_HEADS = GPT2Config(n_embd=14, n_head=7, n_layer=1, n_positions=256, vocab_size=97)  # head_dim 2
LAYOUTS = [GPT2_SMALL, GPT2_MEDIUM, GPT2_LARGE, GPT2_XL, SINGLE_HEAD, ODD, TINY_HEADS]
# On CPU every layout is a graph that takes one to two minutes to compile on 2 cores, so the CPU
# sweep keeps GPT-2's own head layout (head_dim 64) and an odd one (head_dim 12); LM_ONE_LAYER
# below runs a single head inside the whole model. The others differ only in width and head count
# (medium, large, xl), head_dim (14x7: 2) or head count (48x1); the GPU sweep runs all seven.
CPU_LAYOUTS = [GPT2_SMALL, ODD]
SEQ_LENS = [1, 2, 7, 64, 129]

# Whole language models. Each is one compiled graph (about two minutes on 2 cores), so there are two:
# three layers of the ODD head layout with a vocabulary big enough for the test tokenizer, and one
# layer with a single head, a non-default MLP width and the exact GELU, every width a whole number of
# q8_0 and q4_0 blocks so that GGUF can store it quantized (tests/test_gguf.py; LM's 60 and 240 keep
# the kernels' partial blocks tested). examples/04_generate.py uses LM's shapes, so it finds LM's
# graph in MAX's cache.
LM = GPT2Config(n_embd=60, n_head=5, n_layer=3, n_positions=48, vocab_size=320)
# LM with room for prompts that span MAX's pages of 128 tokens (its smallest), for prefix reuse.
LM_PAGES = dataclasses.replace(LM, n_positions=512)
LM_ONE_LAYER = GPT2Config(
    n_embd=32, n_head=1, n_layer=1, n_positions=40, vocab_size=101, n_inner=96, activation_function="gelu"
)
# LM_ONE_LAYER as a GGUF file has it: GELU's tanh form, as llama.cpp computes GPT-2.
LM_ONE_LAYER_GGUF = dataclasses.replace(LM_ONE_LAYER, activation_function="gelu_new")
# The smallest width whose rows the K-quants store: whole super-blocks of 256 weights.
LM_SUPER = GPT2Config(n_embd=256, n_head=4, n_layer=2, n_positions=40, vocab_size=300)

LOWEST = -1.7e38  # what `padding_bias` gives padding
BANNED = float(np.finfo(np.float32).min)  # what a banned token's logit becomes (`logit_controls.ban`)

HAS_GPU = accelerator_count() > 0
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="MAX sees no accelerator (accelerator_count() == 0)")


def serving_missing() -> list[str]:
    """The modules of MAX's serving extra (and the OpenAI client the tests use) that are not installed."""
    return missing_modules((*SERVE_MODULES, "openai"))


def requires_serving() -> pytest.MarkDecorator:
    """Skips, naming what is missing, where MAX's serving extra (or the OpenAI client) is not installed."""
    missing = serving_missing()
    return pytest.mark.skipif(
        bool(missing), reason=f"needs MAX's serving extra (pip install -e '.[serve]'); missing {missing}"
    )


def layout_id(config: GPT2Config) -> str:
    """A test id such as `768x12` (n_embd x n_head)."""
    return f"{config.n_embd}x{config.n_head}"


def random_input(batch: int, seq_len: int, n_embd: int, seed: int = 1) -> np.ndarray:
    """Standard-normal float32 activations `[batch, seq_len, n_embd]`."""
    return np.random.default_rng(seed).standard_normal((batch, seq_len, n_embd)).astype(np.float32)


def prompts(config: GPT2Config, batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """Random token ids `[batch, seq_len]` from `config`'s vocabulary."""
    return np.random.default_rng(seed).integers(0, config.vocab_size, (batch, seq_len))


def left_padding(batch: int, seq_len: int) -> np.ndarray:
    """An attention mask `[batch, seq_len]` where row i has i * 2 padding tokens on the left (row 0 none)."""
    return (np.arange(seq_len)[None, :] >= 2 * np.arange(batch)[:, None]).astype(np.int64)


def looped_controls(logits, prompt, generated, sampler):
    """The controls one token at a time: bias, Hugging Face's repetition penalty, OpenAI's frequency and
    presence penalties, then the n-gram ban over prompt and generated tokens."""
    row = logits.astype(np.float64)
    for token, value in (sampler.logit_bias or {}).items():
        row[token] += value
    for token in set(prompt + generated):
        row[token] = (
            row[token] * sampler.repetition_penalty
            if row[token] < 0
            else row[token] / sampler.repetition_penalty
        )
    for token in set(generated):
        row[token] -= generated.count(token) * sampler.frequency_penalty + sampler.presence_penalty
    n, tokens = sampler.no_repeat_ngram_size, prompt + generated
    if n:
        for start in range(len(tokens) - n + 1):
            if tokens[start : start + n - 1] == tokens[len(tokens) - n + 1 :]:
                row[tokens[start + n - 1]] = BANNED
    return row


def prompt_and_steps(lm: CompiledLM, ids: np.ndarray, prompt: int) -> np.ndarray:
    """Logits `[B, S, V]` of `ids` `[B, S]`: the first `prompt` positions in one `prefill`, then one
    `decode_step` per position."""
    cache = lm.new_cache(ids.shape[0], ids.shape[1])
    got = [lm.prefill(ids[:, :prompt], cache, all_logits=True)]
    got += [lm.decode_step(ids[:, step], cache)[:, None] for step in range(prompt, ids.shape[1])]
    return np.concatenate(got, axis=1)


def run_python(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Runs this interpreter with `args` in a child process, capturing text output (`stdin`: its input).

    The environment is passed explicitly: loading MAX sets PYTHONEXECUTABLE and
    PYTHONPATH in the process's C environment (not in `os.environ`), and a child
    that inherited those would start outside this virtual environment.
    """
    return run_command(sys.executable, *args, stdin=stdin)


def run_command(*command: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Runs `command` with this process's environment (see `run_python`), `stdin` as its input."""
    return subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
        input=stdin,
    )


def die_with_parent() -> None:
    """In a child between fork and exec: have Linux SIGKILL it when its parent dies (elsewhere: nothing)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def attention_reference(cache, qkv, key_bias, heads, stored=np.float64):
    """The new keys and values stored (rounded to `stored`), and causal softmax attention over
    positions 0..T-1, float64."""
    batch, seq_len, width = qkv.shape
    head_dim, total = width // 3 // heads, key_bias.shape[1]
    past = total - seq_len
    cache = cache.astype(np.float64)
    q, k, v = (
        part.reshape(batch, seq_len, heads, head_dim).transpose(0, 2, 1, 3)
        for part in np.split(qkv.astype(np.float64), 3, axis=-1)
    )
    cache[0, :, :, past:total], cache[1, :, :, past:total] = k.astype(stored), v.astype(stored)
    scores = q @ cache[0, :, :, :total].transpose(0, 1, 3, 2) / np.sqrt(head_dim) + key_bias[:, None, None]
    future = np.arange(total)[None, :] > past + np.arange(seq_len)[:, None]  # [S, T]
    scores = np.where(future, -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ cache[1, :, :, :total]).transpose(0, 2, 1, 3).reshape(batch, seq_len, heads * head_dim)
    return out, cache


def scattered_pages(rng, cached, new, page_size, heads, head_dim, layers=3):
    """MAX's paged cache for requests with `cached` tokens bringing `new` ones: random blocks
    [pages, 2, layers, page_size, heads, head_dim] and a lookup table [R, P] naming each request's
    pages, scattered through the blocks, padded as MAX pads it, with a spare page nobody names."""
    needed = [-(-(c + n) // page_size) for c, n in zip(cached, new, strict=True)]
    total_pages = sum(needed) + 2
    order = rng.permutation(total_pages)
    lookup = np.zeros((len(cached), max(needed) + 3), np.uint32)
    start = 0
    for r, count in enumerate(needed):
        lookup[r, :count] = order[start : start + count]
        start += count
    blocks = rng.standard_normal((total_pages, 2, layers, page_size, heads, head_dim), dtype=np.float32)
    return blocks, lookup


def paged_attention_reference(blocks, qkv, cached, lookup, offsets, layer, heads):
    """Each request's keys and values gathered from its pages, new ones stored, causal attention; float64."""
    page_size, head_dim = blocks.shape[3], blocks.shape[5]
    blocks = blocks.astype(np.float64)
    out = np.zeros((qkv.shape[0], heads * head_dim))
    for r, past in enumerate(cached):
        rows = slice(offsets[r], offsets[r + 1])
        parts = np.split(qkv[rows].astype(np.float64), 3, axis=-1)
        q, k, v = (part.reshape(-1, heads, head_dim) for part in parts)
        new, total = len(q), past + len(q)
        for s in range(new):
            page, slot = lookup[r, (past + s) // page_size], (past + s) % page_size
            blocks[page, 0, layer, slot], blocks[page, 1, layer, slot] = k[s], v[s]
        where = [(lookup[r, t // page_size], t % page_size) for t in range(total)]
        keys = np.stack([blocks[page, 0, layer, slot] for page, slot in where], axis=1)  # [H, total, d]
        values = np.stack([blocks[page, 1, layer, slot] for page, slot in where], axis=1)
        scores = q.transpose(1, 0, 2) @ keys.transpose(0, 2, 1) / np.sqrt(head_dim)  # [H, new, total]
        future = np.arange(total)[None, :] > past + np.arange(new)[:, None]
        scores = np.where(future, -np.inf, scores)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out[rows] = (weights @ values).transpose(1, 0, 2).reshape(new, heads * head_dim)
    return out, blocks


def bfloat16_activations(x: np.ndarray) -> np.ndarray:
    """What the bfloat16 kernels multiply by: x rounded to bfloat16 (to nearest, ties to even),
    float64 [M, K]."""
    return bfloat16_bits_to_float32(float32_to_bfloat16_bits(x.astype(np.float32))).astype(np.float64)


def super_block_activations(x: np.ndarray) -> np.ndarray:
    """What the q4_k and q6_k kernels multiply by: x in blocks of 256 (K a multiple of 256), each
    rounded to int8 steps of -its largest-magnitude value / 127, half to even (llama.cpp's q8_K),
    float64 [M, K]."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    at = np.abs(blocks).argmax(axis=-1)[..., None]  # the first of the largest magnitudes
    largest = np.take_along_axis(blocks, at, axis=-1)
    inverse = np.divide(np.float32(-127), largest, out=np.zeros_like(largest), where=largest != 0)
    steps = np.minimum(np.rint(blocks * inverse), 127).astype(np.float64)
    step = np.divide(np.float32(1), inverse, out=np.zeros_like(inverse), where=inverse != 0)
    return (steps * step.astype(np.float64)).reshape(x.shape)


def quantized_activations(x: np.ndarray) -> np.ndarray:
    """What the q8_0 and q4_0 kernels multiply by: x in blocks of 32, each rounded to int8 steps of
    its largest magnitude / 127 (llama.cpp's q8_0 for activations), float64 [M, K]."""
    blocks = np.zeros((x.shape[0], -(-x.shape[1] // BLOCK) * BLOCK), np.float32)
    blocks[:, : x.shape[1]] = x
    blocks = blocks.reshape(x.shape[0], -1, BLOCK)
    largest = np.abs(blocks).max(axis=-1, keepdims=True)
    inverse = np.divide(np.float32(127), largest, out=np.zeros_like(largest), where=largest != 0)
    steps = np.rint(blocks * inverse).astype(np.float64)
    return (steps * (largest.astype(np.float64) / 127)).reshape(x.shape[0], -1)[:, : x.shape[1]]
