"""What a served request carries beyond MAX's own: OpenAI's `logit_bias`, from the route to the worker.

MAX's request (`TextGenerationRequest`, in the HTTP process) and context (`TextContext`, sent
to the model worker) have no field for a per-token bias, so ours add one: the route makes a
`GPT2Request`, our tokenizer (`max_gpt2.serving.tokenizer`) turns it into a `GPT2Context`, and
MAX carries that to the worker as the architecture's context type (`arch.py`), where the
pipeline adds each bias to its token's logit before a token is picked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from max.pipelines.context import TextContext
from max.pipelines.modeling.types import TextGenerationRequest


@dataclass(frozen=True)
class GPT2Request(TextGenerationRequest):
    """MAX's request, with `logit_bias`: token id -> what its logit gains (OpenAI's, -100 to 100)."""

    logit_bias: dict[int, float] | None = None


@dataclass(kw_only=True)
class GPT2Context(TextContext):
    """MAX's context, with the request's `logit_bias` (None: none)."""

    logit_bias: dict[int, float] | None = field(default=None)

    @classmethod
    def of(cls, context: TextContext, logit_bias: dict[int, float] | None) -> GPT2Context:
        """`context` as a `GPT2Context`, with `logit_bias`."""
        values = {each.name: getattr(context, each.name) for each in fields(TextContext) if each.init}
        return cls(**values, logit_bias=logit_bias)
