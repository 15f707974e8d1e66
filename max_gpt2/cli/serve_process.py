"""`python -m max_gpt2.cli.serve_process serve ...`: MAX's `max serve`, with our front end on its HTTP app.

It takes exactly `max serve`'s options and runs MAX's own entry point; what differs is
the HTTP app, which gets our routes and guard mounted before it serves (MAX 26.7 has no
option for routes or middleware of one's own, so the function that builds the app is
wrapped: `max_internals.run_max_serve`), with, where `ServingSettings.explorer` says so,
the head explorer (`max_gpt2.explorer.loading`); and MAX's metrics process, which serves
on our Unix socket rather than a port of its own (`serving.api.metrics.metrics_process`). Our
settings come from `ServingSettings.from_environment`, the API key from `MAX_GPT2_API_KEY`,
never the command line, where other users of the machine could read it. `max-gpt2 serve`
runs this: the process it becomes, above `serving/` and `explorer/`, which mounts both.
"""

from __future__ import annotations

import os


def main() -> None:
    from max_gpt2.explorer.loading import ExplorerSettings, LoadingExplorer
    from max_gpt2.max_internals import run_max_serve, use_metrics_socket
    from max_gpt2.serving.api.guard import EXPLORER
    from max_gpt2.serving.api.metrics import metrics_process
    from max_gpt2.serving.api.routes import mount
    from max_gpt2.serving.settings import API_KEY_VARIABLE, ServingSettings

    settings = ServingSettings.from_environment()
    api_key = os.environ.get(API_KEY_VARIABLE) or None
    explorer = (
        LoadingExplorer(ExplorerSettings.from_json(settings.explorer), EXPLORER)
        if settings.explorer
        else None
    )
    if settings.metrics_socket:
        use_metrics_socket(metrics_process)
    run_max_serve(lambda app: mount(app, settings, api_key, explorer))


if __name__ == "__main__":
    main()
