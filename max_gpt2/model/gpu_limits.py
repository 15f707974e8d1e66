"""What MAX 26.7 cannot compile, or computes wrong, for GPT-2 on an NVIDIA GPU, by architecture: refused
before compiling, naming the GPU (`GPU`, as `max_gpt2.inference.devices.gpu_of` describes a device).

Measured on an H200 (`tests/test_gpu.py`); other architectures were never found wanting, so only
Hopper (sm_90) has entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from max.dtype import DType


class GPU(NamedTuple):
    """An NVIDIA GPU as the refusals name it: `"gpu:N"` and its architecture (`"sm_90a"`)."""

    name: str
    architecture: str


def hopper_refusal(architecture: str, dtype: DType, n_embd: int) -> str | None:
    """Why MAX 26.7 cannot compile GPT-2 of width `n_embd` in `dtype` on an NVIDIA GPU of
    `architecture`, or None where it can.

    On Hopper (sm_90) float16 attention fails to compile, graph and flash alike (a constraint in
    MAX's sm_90 attention kernel's tensor-core MMA), and bfloat16 matmuls fail where a row of
    `n_embd` values is not a whole number of 16 bytes (MAX's sm_90 tile loader: widths 40, 56, 64,
    72, 768 and 1600 compile, 60 does not).
    """
    if not architecture.startswith("sm_90"):
        return None
    if dtype == DType.float16:
        return "float16 attention does not compile on NVIDIA Hopper (sm_90) in MAX 26.7; use bfloat16"
    if dtype == DType.bfloat16 and n_embd % 8:
        return (
            f"bfloat16 on NVIDIA Hopper (sm_90) needs n_embd divisible by 8 in MAX 26.7 (its matmul "
            f"loads rows in 16-byte tiles); got n_embd={n_embd}"
        )
    return None


def hopper_attention_weights_refusal(architecture: str, dtype: DType) -> str | None:
    """Why MAX 26.7 returns wrong attention weights (the `"attentions"` graph variant) in `dtype`
    on an NVIDIA GPU of `architecture`, or None where they were found right or never checked.

    In bfloat16 the weights from MAX's softmax lack the causal mask (each row spreads over every
    key, later ones included; written out as exp / sum they keep it), and in every form tried the
    first one to three runs in a process return some layers' weights as zeros (waiting for the
    device before or after reading changes nothing). The float32 weights there match the
    reference from the first run, and the bfloat16 logits are right.
    """
    if architecture.startswith("sm_90") and dtype == DType.bfloat16:
        return (
            "attention weights in bfloat16 on NVIDIA Hopper (sm_90) come out wrong in MAX 26.7 "
            "(the causal mask is lost and early runs return zeros); use dtype='float32'"
        )
    return None


def check_compiles(gpu: GPU | None, dtype: DType, n_embd: int) -> None:
    """Refuses, before a compile that would fail minutes later, what `hopper_refusal` names (`gpu`
    None: not an NVIDIA GPU, nothing refused)."""
    _refuse_on(gpu, lambda architecture: hopper_refusal(architecture, dtype, n_embd))


def check_attention_weights(gpu: GPU | None, dtype: DType) -> None:
    """Refuses, before compiling the attention-weights variant, what `hopper_attention_weights_refusal`
    names."""
    _refuse_on(gpu, lambda architecture: hopper_attention_weights_refusal(architecture, dtype))


def _refuse_on(gpu: GPU | None, refusal: Callable[[str], str | None]) -> None:
    reason = None if gpu is None else refusal(gpu.architecture)
    if reason:
        raise ValueError(f"{gpu.name} ({gpu.architecture}): {reason}")
