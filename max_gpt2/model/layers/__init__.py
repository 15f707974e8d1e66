"""GPT-2's module tree as MAX modules: the attention (three ways), the block, the whole language
model, the layers that run on our kernels and the packed projections, and the graph variants."""
