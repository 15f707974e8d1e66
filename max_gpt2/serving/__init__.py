"""GPT-2 as a custom architecture for MAX's serving engine (`max serve`).

    max serve --custom-architectures max_gpt2.serving --model path/to/gpt2 --devices cpu

MAX imports this package and finds `ARCHITECTURES`; a checkpoint whose
`config.json` names `GPT2LMHeadModel` is then served by our model on MAX's paged
KV cache, behind MAX's OpenAI-compatible HTTP server. Needs MAX's serving extra
(`pip install 'max-gpt2[serve]'`); the rest of the package does not.
docs/serving.md describes the server, docs/architecture.md lists the modules.
"""

from max_gpt2.serving.arch import gpt2_arch

ARCHITECTURES = [gpt2_arch]
