"""Benchmarks: ours against the field, side by side in one run, with the machine they ran on.

`max-gpt2 bench` (the attention beside NumPy and PyTorch), `bench-generate` (generation beside
Hugging Face and llama.cpp) and `bench-startup` (a process to its first token beside llama.cpp)
run here. docs/performance.md says how they measure and what they measured; docs/architecture.md
lists the modules.
"""
