"""GPT-2 as a custom architecture for MAX's serving engine (`max serve`).

    max serve --custom-architectures max_gpt2.serving --model path/to/gpt2 --devices cpu

MAX imports this package and reads `ARCHITECTURES`; a checkpoint whose `config.json` names
`GPT2LMHeadModel` is then served by our model on MAX's paged KV cache (or, with MAX's
`--task embeddings_generation`, its embeddings: `max_gpt2.serving.embeddings_model`), behind MAX's
OpenAI-compatible HTTP server, with our front end (`max_gpt2.serving.api`) in place of its
routes. Needs MAX's serving extra (`pip install 'max-gpt2[serve]'`); the rest of the package
does not. `ARCHITECTURES` is made when first read, so a process that needs only a light
module of the package (the settings, MAX's metrics process) does not load the model's code.
docs/serving.md describes the server, docs/architecture.md lists the modules.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "ARCHITECTURES":
        from max_gpt2.serving.arch import gpt2_arch, gpt2_embeddings_arch

        return [gpt2_arch, gpt2_embeddings_arch]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
