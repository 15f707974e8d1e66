"""GPT-2 as a custom architecture for MAX's serving engine (`max serve`).

    max serve --custom-architectures max_gpt2.serving --model path/to/gpt2 --devices cpu

MAX imports this package and finds `ARCHITECTURES`; a checkpoint whose
`config.json` names `GPT2LMHeadModel` is then served by our model on MAX's paged
KV cache, behind MAX's OpenAI-compatible HTTP server. Needs MAX's serving extra
(`pip install 'max-gpt2[serve]'`); the rest of the package does not.

    arch.py            the registration: names, encodings, weight adapter, pipeline model and class, tokenizer
    model_config.py    config.json, settings, MAX_GPT2_WEIGHT_FORMAT -> shapes, dtype, weight format, KV cache
    weight_adapters.py the checkpoint's weights as load_lm binds them (safetensors or GGUF)
    memory_planner.py  how many requests a CPU step decodes together
    model.py           the pipeline model: reads and packs our checkpoint, compiles, log-probabilities
    pipeline.py        MAX's pipeline: penalties on the host, greedy CPU steps by argmax, several a step
    paged_gpt2.py      the graph: our blocks with an attention over the paged cache
    tokenizer.py       MAX's text tokenizer, refusing (HTTP 400) prompts the model cannot run
    requests.py        every field of a completion request: honoured, rewritten or refused by name
    guard.py           the HTTP guard: API key, the routes GPT-2 answers, checked completions
    server.py          `max serve` with the guard installed (what `max-gpt2 serve` runs)
    max_internals.py   every use of MAX's private API, each with why (checked against the installed MAX)
"""

from max_gpt2.serving.arch import gpt2_arch

ARCHITECTURES = [gpt2_arch]
