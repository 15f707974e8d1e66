"""The server's HTTP front end: the routes clients of llama-server and vLLM call, over MAX's engine.

`routes.mount` puts them on the app MAX's server builds, in place of MAX's own routes:
completions and chat completions (`answer.py` runs both through MAX's engine, `choices.py`
reads each choice), tokenize, metrics, models, with the guard (API key, routes) and CORS in
front. docs/serving.md describes what each route takes; docs/architecture.md lists the modules.
"""
