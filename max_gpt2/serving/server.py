"""`python -m max_gpt2.serving.server serve ...`: MAX's `max serve`, with our guard in front of its routes.

It takes exactly `max serve`'s options and runs MAX's own entry point; the one
difference is the HTTP app, which gets `max_gpt2.serving.guard` installed before
it serves (MAX 26.7 has no option for middleware of one's own, so the function
that builds the app is wrapped: `max_internals.run_max_serve`), and, with `--explorer`,
the head explorer (`max_gpt2.explorer.loading`). The API key comes
from `MAX_GPT2_API_KEY`, never the command line, where other users of the machine
could read it. `max-gpt2 serve` runs this.
"""

from __future__ import annotations

import os

# What `max-gpt2 serve` hands MAX's server in its environment: MAX's command line has no option an
# architecture may add. The API key never goes on a command line, where other users read it.
API_KEY_VARIABLE = "MAX_GPT2_API_KEY"  # --api-key
WEIGHT_FORMAT_VARIABLE = "MAX_GPT2_WEIGHT_FORMAT"  # --weight-format (`model_config.served_weight_format`)
DECODE_STEPS_VARIABLE = "MAX_GPT2_DECODE_STEPS"  # --decode-steps (`pipeline.served_decode_steps`)
PROMPT_LOOKUP_VARIABLE = "MAX_GPT2_PROMPT_LOOKUP"  # --prompt-lookup (`drafts.served_prompt_lookup`)
EXPLORER_VARIABLE = "MAX_GPT2_EXPLORER"  # --explorer: `explorer.loading.ExplorerSettings` as JSON


def main() -> None:
    from max_gpt2.explorer.loading import ExplorerSettings, LoadingExplorer
    from max_gpt2.serving.guard import EXPLORER, install
    from max_gpt2.serving.max_internals import run_max_serve

    def on_app(app: object) -> None:
        settings = os.environ.get(EXPLORER_VARIABLE)
        explorer = LoadingExplorer(ExplorerSettings.from_json(settings), EXPLORER) if settings else None
        install(app, os.environ.get(API_KEY_VARIABLE) or None, explorer)

    run_max_serve(on_app)


if __name__ == "__main__":
    main()
