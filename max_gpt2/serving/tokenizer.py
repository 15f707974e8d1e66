"""The server's tokenizer: MAX's `TextTokenizer`, refusing what this server cannot answer.

It runs in MAX's API process, before a request reaches the model worker, so an
`InputError` raised here is an HTTP 400 for that request alone and the server
goes on. `echo` with `logprobs` asks for the prompt's log-probabilities, which
need every token's logits: a server started without `--enable-echo` would raise
inside the worker for it, and take the whole server down.
"""

from __future__ import annotations

from typing import Any

from max.pipelines.context import TextContext
from max.pipelines.context.exceptions import InputError
from max.pipelines.lib import PipelineConfig, TextTokenizer
from max.pipelines.modeling.types import TextGenerationRequest


class GPT2TextTokenizer(TextTokenizer):
    """`TextTokenizer` that answers echo-with-logprobs requests with a 400 where echo is off."""

    def __init__(self, model_path: str, pipeline_config: PipelineConfig, **kwargs: Any) -> None:
        super().__init__(model_path, pipeline_config, **kwargs)
        self.echo_enabled = pipeline_config.model.enable_echo

    async def new_context(self, request: TextGenerationRequest) -> TextContext:
        if request.echo and request.logprobs and not self.echo_enabled:
            raise InputError(
                "echo with logprobs needs the prompt's log-probabilities, and this server was started "
                "without them: start it with --enable-echo (max-gpt2 serve does)"
            )
        return await super().new_context(request)
