"""An independent NumPy reference for GPT-2, attention and the whole language model, in float64.

Written the plain way on purpose, sharing no code with the MAX modules: each
head is computed on its own in a Python loop over column slices (no reshape or
transpose into a head axis), the causal and padding rules are boolean tests
rather than additive masks, the heads are concatenated at the end, and the model
recomputes every position from scratch (no KV cache). Nothing here imports MAX,
so a mistake in the graph cannot be repeated here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # for annotations only; the config module imports nothing from MAX either
    from max_gpt2.model.config import GPT2Config


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the row maximum for stability."""
    # `initial` keeps an empty sequence (no rows) from failing the reduction.
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True, initial=-np.inf))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def attention(
    x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int, key_mask: np.ndarray | None = None
) -> np.ndarray:
    """GPT-2 causal self-attention of `x` `[batch, seq, n_embd]`, computed in float64.

    `weights` holds `c_attn.weight` `[3 * n_embd, n_embd]`, `c_attn.bias`,
    `c_proj.weight` `[n_embd, n_embd]` and `c_proj.bias`, in MAX `Linear`
    layout (what `load_attention_weights` returns). `key_mask` hides padding (see
    `attention_and_largest_score`). Returns float64 `[batch, seq, n_embd]`.
    """
    return attention_and_largest_score(x, weights, n_head, key_mask)[0]


def attention_and_largest_score(
    x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int, key_mask: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """`attention(x, weights, n_head)`, and the largest |q . k / sqrt(head_dim)| any query may see.

    The largest score measures how sensitive the output is to rounding: a
    score's rounding error grows with its size, and softmax passes it on.
    `key_mask` `[batch, seq]` (true = token, false = padding) hides padding from
    every query; a query that then sees no key at all (padding itself, in a
    left-padded row) gets zeros.
    """
    attended = attend(x, weights, n_head, key_mask)
    return attended.output, attended.largest_score


def attention_weights(
    x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int, key_mask: np.ndarray | None = None
) -> np.ndarray:
    """The softmax weights of every head, float64 `[batch, n_head, seq, seq]` (query rows, key columns).

    A row sums to 1 over the keys its query may see and is 0 elsewhere; a query
    that sees no key (padding) has a row of zeros.
    """
    return attend(x, weights, n_head, key_mask).weights


class Attended(NamedTuple):
    output: np.ndarray  # [batch, seq, n_embd]
    weights: np.ndarray  # [batch, n_head, seq, seq]
    largest_score: float


def attend(
    x: np.ndarray, weights: Mapping[str, np.ndarray], n_head: int, key_mask: np.ndarray | None = None
) -> Attended:
    """The attention's output, every head's weights and the largest score (see the functions above)."""
    x = np.asarray(x, dtype=np.float64)
    w_attn, b_attn, w_proj, b_proj = (
        np.asarray(weights[name], dtype=np.float64)
        for name in ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")
    )
    _, seq_len, n_embd = x.shape
    head_dim = n_embd // n_head

    qkv = x @ w_attn.T + b_attn  # [batch, seq, 3 * n_embd]: queries, then keys, then values
    queries, keys, values = qkv[..., :n_embd], qkv[..., n_embd : 2 * n_embd], qkv[..., 2 * n_embd :]
    position = np.arange(seq_len)
    future = position[None, :] > position[:, None]  # [seq, seq]: key after query
    if key_mask is not None:
        hidden = future | ~np.asarray(key_mask, dtype=bool)[:, None, :]  # [batch, seq, seq]
    else:
        hidden = np.broadcast_to(future, (x.shape[0], seq_len, seq_len))
    sees_a_key = ~hidden.all(axis=-1, keepdims=True)  # [batch, seq, 1]

    head_outputs, head_weights, largest_score = [], [], 0.0
    for head in range(n_head):
        columns = slice(head * head_dim, (head + 1) * head_dim)
        q, k, v = queries[..., columns], keys[..., columns], values[..., columns]
        scores = np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(head_dim)  # [batch, seq, seq]
        largest_score = max(largest_score, float(np.abs(scores[~hidden]).max(initial=0.0)))
        # A row that may see no key is left unmasked here (so softmax stays finite), then zeroed.
        probabilities = softmax(np.where(hidden & sees_a_key, -np.inf, scores))
        head_weights.append(np.where(sees_a_key, probabilities, 0.0))  # [batch, seq, seq]
        head_outputs.append(head_weights[-1] @ v)  # [batch, seq, head_dim]

    merged = np.concatenate(head_outputs, axis=-1)  # [batch, seq, n_embd]
    return Attended(merged @ w_proj.T + b_proj, np.stack(head_weights, axis=1), largest_score)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, epsilon: float) -> np.ndarray:
    """Normalizes the last axis to zero mean and unit variance, then scales and shifts."""
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + epsilon) * weight + bias


def activation(x: np.ndarray, activation_function: str = "gelu_new") -> np.ndarray:
    """The MLP's activation, by Hugging Face's name for it."""
    name = activation_function
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast"):  # GPT-2's own
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name in ("gelu", "gelu_python"):
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if name == "quick_gelu":
        return x / (1 + np.exp(-1.702 * x))
    if name == "relu":
        return np.maximum(x, 0)
    if name in ("silu", "swish"):
        return x / (1 + np.exp(-x))
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "linear":
        return x
    raise ValueError(f"the reference has no activation {name!r}")


def position_ids(attention_mask: np.ndarray) -> np.ndarray:
    """Each token's position counts only the real tokens before it; padding gets 0."""
    return np.maximum(np.cumsum(attention_mask, axis=-1) - 1, 0)


def lm_logits_and_largest_score(
    input_ids: np.ndarray,
    weights: Mapping[str, np.ndarray],
    config: GPT2Config,
    attention_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """GPT-2's next-token logits `[batch, seq, vocab]`, float64, and the largest attention score.

    `weights` holds every parameter by module name in MAX layout (what
    `Checkpoint.model_weights` returns). `attention_mask` `[batch, seq]` marks real tokens with 1 and
    padding with 0; padding positions get logits too, but nothing real depends on them.
    """
    run = lm_forward(input_ids, weights, config, attention_mask)
    return run.logits, run.largest_score


class LMForward(NamedTuple):
    logits: np.ndarray  # [batch, seq, vocab]
    hidden: np.ndarray  # [batch, seq, n_embd]: the final layer norm's output
    attentions: np.ndarray  # [layers, batch, heads, seq, seq]
    largest_score: float


def lm_forward(
    input_ids: np.ndarray,
    weights: Mapping[str, np.ndarray],
    config: GPT2Config,
    attention_mask: np.ndarray | None = None,
) -> LMForward:
    """The whole model once: logits, hidden states, attention weights and largest score (see the functions
    above)."""
    w = {name: np.asarray(value, dtype=np.float64) for name, value in weights.items()}
    ids = np.asarray(input_ids)
    mask = np.ones(ids.shape, dtype=np.int64) if attention_mask is None else np.asarray(attention_mask)
    epsilon, n_head = config.layer_norm_epsilon, config.n_head
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][position_ids(mask)]
    largest_score, attentions = 0.0, []
    for layer in range(config.n_layer):
        h = f"transformer.h.{layer}."
        attn = {name: value for name, value in w.items() if name.startswith(h + "attn.")}
        attn = {name.removeprefix(h + "attn."): value for name, value in attn.items()}
        normed = layer_norm(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"], epsilon)
        attended = attend(normed, attn, n_head, mask.astype(bool))
        largest_score = max(largest_score, attended.largest_score)
        attentions.append(attended.weights)
        x = x + attended.output
        normed = layer_norm(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"], epsilon)
        inner = activation(
            normed @ w[h + "mlp.c_fc.weight"].T + w[h + "mlp.c_fc.bias"], config.activation_function
        )
        x = x + inner @ w[h + "mlp.c_proj.weight"].T + w[h + "mlp.c_proj.bias"]
    x = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], epsilon)
    return LMForward(x @ w["lm_head.weight"].T, x, np.stack(attentions), largest_score)
