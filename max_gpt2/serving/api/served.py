"""What the routes read of the running server: MAX's engine and its config, our settings and slots.

MAX builds its engine (`TokenGeneratorPipeline`: our tokenizer, and a proxy to the model
worker) and keeps it, with the pipeline's config, in the HTTP app's state; `mount`
(`max_gpt2.serving.api.routes`) adds our `ServingSettings` and the requests' `Slots` beside them.
`Served.of(request)` gathers the four for a route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from max.pipelines.lib import PipelineConfig
from max.pipelines.modeling.types import TextGenerationRequest
from max.serve.pipelines.llm import TokenGeneratorPipeline
from starlette.requests import Request

from max_gpt2.serving.api.choices import Choice
from max_gpt2.serving.api.protocol import Refusal
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.memory_planner import planned_batch_size
from max_gpt2.serving.settings import ServingSettings
from max_gpt2.serving.tokenizer import GPT2TextTokenizer

if TYPE_CHECKING:  # the slots' module reads the served model
    from max_gpt2.serving.api.slots import Slots


@dataclass(frozen=True)
class Served:
    """MAX's engine, its pipeline config and our settings, as the app holds them."""

    engine: TokenGeneratorPipeline
    config: PipelineConfig
    settings: ServingSettings
    slots: Slots

    @classmethod
    def of(cls, request: Request) -> Served:
        state: Any = request.app.state
        return cls(state.pipeline, state.pipeline_config, state.serving, state.slots)

    @property
    def total_slots(self) -> int | None:
        """Requests decoded together, as llama-server's slots (None where MAX plans its batch itself)."""
        return planned_batch_size(self.config)

    async def start(self, request: TextGenerationRequest, asked: Asked) -> Choice:
        """`request` (one choice of `asked`) submitted to MAX's engine (MAX's `InputError` for a bad prompt),
        seated in a slot (`max_gpt2.serving.api.slots`)."""
        choice = await Choice.start(self.engine, request, asked.rules)
        self.slots.enter(choice, asked.sampling, self.total_slots)
        return choice

    @property
    def tokenizer(self) -> GPT2TextTokenizer:
        tokenizer = self.engine.tokenizer
        assert isinstance(tokenizer, GPT2TextTokenizer), "arch.py registers our tokenizer"
        return tokenizer

    @property
    def lora_scales(self) -> tuple[float, ...]:
        """The scales the served LoRA adapters were merged at, in their order (none: no adapter)."""
        return tuple(scale for _, scale in self.settings.lora)

    @property
    def vocab_size(self) -> int:
        """Token ids the model has: 0 to this, less one."""
        return self.tokenizer.model_vocab_size

    @property
    def context_length(self) -> int:
        """Tokens the model sees at most (GPT-2's `n_positions`), prompt and completion together."""
        return self.tokenizer.n_positions

    def check_constraint(self, asked: Asked) -> None:
        """Refuses, naming its field, the request's constraint where the grammar engine cannot compile it
        (its message). The first compile of a kind takes seconds: the route calls this off its loop."""
        assert asked.constraint is not None, "a request with a constraint"
        try:
            self.tokenizer.grammars.compiled(asked.constraint)
        except ValueError as error:
            raise Refusal(asked.constraint_field, f"{asked.constraint_field}: {error}") from None

    def model_name(self, asked: str | None) -> str:
        """The served name a request asked for (the first where it named none); a `Refusal` (404, as
        OpenAI's) for a name not served here."""
        names = self.settings.served_names
        if not asked:
            return names[0]
        if asked not in names:
            served = ", ".join(repr(name) for name in names)
            raise Refusal("model", f"model: {asked!r} is not served here; this server serves {served}", 404)
        return asked
