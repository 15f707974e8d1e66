"""GPT-2's checkpoints read and written: safetensors directories (local or from the Hub), GGUF files,
Hugging Face's names adapted to ours, each parameter as stored turned into what a model binds, and
the weights cache that keeps a conversion once."""
