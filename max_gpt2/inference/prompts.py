"""Checking what users hand the language model, before any work: token ids, masks, lengths.

Every refusal names what was wrong and the numbers involved. Also here: position
ids, which count real tokens only, as Hugging Face counts them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from max_gpt2.model.config import GPT2Config


def position_ids(attention_mask: np.ndarray) -> np.ndarray:
    """Positions count real tokens only (Hugging Face's rule); padding gets 0, and is never attended."""
    return np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)


def int_array(values: Any, name: str, dims: tuple[str, ...] = ("batch", "seq")) -> np.ndarray:
    """`values` as an int64 array of `dims`, or a TypeError/ValueError naming `name`."""
    shape = f"[{', '.join(dims)}]"
    try:
        array = np.asarray(values)
    except ValueError:  # NumPy's "inhomogeneous shape"
        raise ValueError(
            f"{name} must be a {shape} array, its rows of one length; pad them (attention_mask)"
        ) from None
    if array.dtype == object and all(isinstance(value, int) for value in array.flat):
        raise ValueError(f"{name} holds an integer past int64: ids are within the vocabulary")
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.ndim != len(dims):
        raise ValueError(f"{name} must have shape {shape}, got {list(array.shape)}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {array.max()}, past int64: ids are within the vocabulary")
    return array.astype(np.int64, copy=False)


def check_vocabulary(ids: np.ndarray, vocab: int, name: str) -> None:
    """A ValueError naming the first id in `ids` outside `0..vocab - 1`, and where it is."""
    outside = (ids < 0) | (ids >= vocab)
    if outside.any():
        where = tuple(np.argwhere(outside)[0].tolist())
        raise ValueError(
            f"{name}[{', '.join(map(str, where))}] = {ids[where]} is outside the vocabulary (0..{vocab - 1})"
        )


def check_prompt(
    config: GPT2Config, input_ids: Any, attention_mask: Any = None, new_tokens: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """`input_ids` and `attention_mask` checked against `config`, both as int64 [batch, seq].

    With `new_tokens` (generation), prompt plus new tokens must fit in
    `n_positions`, and padding must be on the left, so that every row's next
    token follows its last real one.
    """
    ids = int_array(input_ids, "input_ids")
    batch, seq_len = ids.shape
    if batch == 0 or seq_len == 0:
        raise ValueError(f"input_ids is empty (shape {list(ids.shape)}): give at least one token per row")
    limit = config.n_positions
    if seq_len + new_tokens > limit:
        wanted = f"{seq_len} prompt tokens" + (f" + {new_tokens} new tokens" if new_tokens else "")
        raise ValueError(
            f"{wanted} = {seq_len + new_tokens} positions, but the model has n_positions={limit}"
        )
    check_vocabulary(ids, config.vocab_size, "input_ids")
    if attention_mask is None:
        return ids, np.ones_like(ids)
    mask = int_array(attention_mask, "attention_mask")
    if mask.shape != ids.shape:
        raise ValueError(
            f"attention_mask has shape {list(mask.shape)}, input_ids {list(ids.shape)}: they must match"
        )
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    if empty := np.flatnonzero(mask.sum(axis=1) == 0).tolist():
        raise ValueError(f"attention_mask rows {empty} are all padding: every row needs a token")
    if new_tokens:
        check_left_padding(mask)
    return ids, mask


def check_left_padding(attention_mask: np.ndarray) -> None:
    """Refuses rows that end in padding: a new token must follow each row's last real one, and an
    embedding pools the last position's state as the last token's."""
    if right_padded := np.flatnonzero(attention_mask[:, -1] == 0).tolist():
        raise ValueError(
            f"attention_mask rows {right_padded} end in padding: for generation and embeddings, "
            "pad prompts on the left"
        )


def check_tokens(config: GPT2Config, tokens: Any, batch: int, per_row: bool = False) -> np.ndarray:
    """One token id per row, `[batch]` (`per_row`: one or more, `[batch, S]`), inside the vocabulary;
    as int64."""
    array = np.asarray(tokens)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"tokens must hold integers, got dtype {array.dtype}")
    if per_row and (array.ndim != 2 or array.shape[0] != batch or array.shape[1] < 1):
        raise ValueError(f"tokens must have shape [batch={batch}, S >= 1], got {list(array.shape)}")
    if not per_row and array.shape != (batch,):
        raise ValueError(f"tokens must have shape [batch={batch}], one per row, got {list(array.shape)}")
    vocab = config.vocab_size
    if (outside := np.argwhere((array < 0) | (array >= vocab))).size:
        at = tuple(int(i) for i in outside[0])
        where = ", ".join(map(str, at))
        raise ValueError(f"tokens[{where}] = {array[at]} is outside the vocabulary (0..{vocab - 1})")
    return array.astype(np.int64, copy=False)


def check_generation(config: GPT2Config, max_new_tokens: Any, eos_token_id: Any) -> tuple[int, ...]:
    """Refuses a non-positive `max_new_tokens`, or an `eos_token_id` outside the vocabulary.

    `eos_token_id` is None, one id or a sequence of ids; returns them as a tuple.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    ids = () if eos_token_id is None else eos_token_id
    ids = tuple(ids) if isinstance(ids, (list, tuple, np.ndarray)) else (ids,)
    vocab = config.vocab_size
    valid = all(isinstance(id_, (int, np.integer)) and not isinstance(id_, bool) for id_ in ids)
    if not valid or not all(0 <= id_ < vocab for id_ in ids):
        wanted = f"a token id in 0..{vocab - 1}, a list of them, or None"
        raise ValueError(f"eos_token_id must be {wanted}; got {eos_token_id!r}")
    return tuple(int(id_) for id_ in ids)
