"""What each stage runs: GPT-2's shapes on a GPU (`FULL`), tiny ones on the CPU for the dry run (`TINY`)."""

from __future__ import annotations

from dataclasses import dataclass

from max_gpt2 import GPT2Config


@dataclass(frozen=True)
class Plan:
    device: str  # as `load_lm` takes it
    attention: tuple[GPT2Config, ...]  # the widths the attention module is checked at
    attention_shapes: tuple[tuple[int, int], ...]  # (batch, length)
    lm: GPT2Config  # the language model checked, served and timed
    dtypes: tuple[str, ...]  # the LM's compute dtypes (the attention's are always float32 and bfloat16)
    new_tokens: int  # greedy tokens checked against the reference
    prompt_lengths: tuple[int, ...]  # the rows of that batch, left-padded
    decode_cases: tuple[tuple[int, int, int], ...]  # (batch, prompt, new) timed
    prompt: int  # the prompt timed to its first token
    rounds: int  # interleaved rounds of timing


FULL = Plan(
    device="gpu",
    attention=(GPT2Config(), GPT2Config(n_embd=1600, n_head=25, n_layer=48)),  # small, xl
    attention_shapes=((1, 1), (4, 129), (1, 1024)),
    lm=GPT2Config(),
    dtypes=("float32", "bfloat16"),
    new_tokens=64,
    prompt_lengths=(8, 5),
    decode_cases=((1, 32, 128), (16, 32, 128)),
    prompt=512,
    rounds=3,
)

# The test suite's own shapes (tests/support.py's ODD and LM), so that after `make test` has compiled them
# the dry run compiles nothing; bfloat16 is the GPU's compute dtype, and the suite compiles no
# bfloat16 LM on the CPU.
TINY = Plan(
    device="cpu",
    attention=(GPT2Config(n_embd=60, n_head=5, n_layer=3, n_positions=256, vocab_size=97),),
    attention_shapes=((1, 1), (4, 129)),
    lm=GPT2Config(n_embd=60, n_head=5, n_layer=3, n_positions=48, vocab_size=320),
    dtypes=("float32",),
    new_tokens=24,
    prompt_lengths=(8, 5),
    decode_cases=((1, 8, 16), (16, 8, 16)),
    prompt=40,
    rounds=2,
)
