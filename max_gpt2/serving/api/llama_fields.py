"""llama-server's fields on every route, checked (`max_gpt2.serving.api.llama_samplers` holds their
tables): a sampler or setting this server lacks refused where it acts (`refuse_acting`), its penalties'
window (`llama_penalties`), and `post_sampling_probs` (`post_sampling`): the log-probabilities asked for
are then of what each token was drawn from, in llama-server's shape.
"""

from __future__ import annotations

from typing import Any

from max_gpt2.serving.api.llama_samplers import first_acting
from max_gpt2.serving.api.protocol import ChatRequest, CompletionRequest, Refusal


def refuse_acting(body: Any, merged: tuple[float, ...] = ()) -> None:
    """A `Refusal` for the first sampler or setting this server lacks that `body` sets (`llama_samplers`);
    its `lora` checked against the scales the served adapters were merged at (`merged`, `check_lora`)."""
    if body.lora:
        check_lora(body.lora, merged)
    if found := first_acting(body):
        field, off = found
        raise Refusal(field, f"{field}: this server has no such sampler or setting; leave it out or {off}")


def check_lora(entries: Any, merged: tuple[float, ...]) -> None:
    """A `Refusal` naming `lora` unless llama-server's `lora` (`[{"id", "scale"}, ...]`, an adapter left
    out at scale 0) asks for the scales the served adapters were merged at: they are fixed at start."""
    if not isinstance(entries, list):
        raise Refusal("lora", 'lora: a list of {"id": N, "scale": S}')
    asked = [0.0] * len(merged)
    for index, entry in enumerate(entries):
        ident = entry.get("id") if isinstance(entry, dict) else None
        scale = entry.get("scale", 0.0) if isinstance(entry, dict) else None
        if not (isinstance(ident, int) and 0 <= ident < len(merged) and isinstance(scale, (int, float))):
            ids = f"0 to {len(merged) - 1}" if merged else "none: no adapter is merged"
            raise Refusal(
                "lora", f'lora[{index}]: {{"id", "scale"}} with an id of the adapters ({ids}); got {entry!r}'
            )
        asked[ident] = float(scale)
    if asked != list(merged):
        raise Refusal(
            "lora",
            f"lora: the adapters were merged into the weights at scales {list(merged)} when the server "
            f"started (--lora-scaled PATH:SCALE), and this asks for {asked}",
        )


def llama_penalties(body: CompletionRequest | ChatRequest, context_length: int) -> int | None:
    """How many of the context's last tokens the penalties count where `body` asks in llama-server's
    fields (`repeat_penalty`, `repeat_last_n`: 64 unset, -1 the whole context, 0 none), as llama-server
    counts them, the frequency and presence penalties too; None where it does not."""
    if body.repeat_penalty is None and body.repeat_last_n is None:
        return None
    if body.repeat_penalty is not None and body.repetition_penalty is not None:
        raise Refusal(
            "repeat_penalty",
            "repeat_penalty: llama-server's, over the last repeat_last_n tokens; repetition_penalty is "
            "Hugging Face's and vLLM's, over the whole context: give one",
        )
    last = 64 if body.repeat_last_n is None else body.repeat_last_n
    if last < -1:
        raise Refusal("repeat_last_n", f"repeat_last_n: -1 (the whole context), 0 (none) or more; got {last}")
    return context_length if last == -1 else last


def post_sampling(body: CompletionRequest | ChatRequest, logprobs: int | None, echo: bool) -> bool:
    """Whether the log-probabilities `body` asks for (`logprobs`: None, none) are of what each token was
    drawn from, after the sampler chain (`post_sampling_probs`), as llama-server gives them; with `echo`
    refused: a prompt's tokens were not drawn."""
    if not body.post_sampling_probs:
        return False
    if echo:
        raise Refusal(
            "post_sampling_probs",
            "post_sampling_probs: the prompt's tokens echoed were not drawn; leave out echo or this",
        )
    return logprobs is not None
