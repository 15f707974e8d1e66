"""Benchmarks: ours against the field, side by side in one run, with the machine they ran on.

attention.py              the attention implementations, NumPy and PyTorch (`max-gpt2 bench`)
attention_contenders.py   how each of those is called
attention_report.py       bench's table and plot
bandwidth.py              how fast this machine streams weights, and the bytes a decoding step reads
generation.py             text generation against Hugging Face (`max-gpt2 bench-generate`)
generation_contenders.py  our CompiledLM, Hugging Face's generate and llama.cpp's llama-bench
generation_report.py      bench-generate's table and plot
harness.py                the machine, a matmul peak, memory, cold compiles, settling between runtimes
llama_cpp.py              llama.cpp's llama-bench on GGUF files, an optional peer
report.py                 JSON, tables and plots, written atomically
server.py                 `max-gpt2 serve` in a child process (tests, benchmarks/serving.py)
"""
