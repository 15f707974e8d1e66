"""What the attention heads do: a summary per head, and a gallery of heatmaps (`max-gpt2 heads`).

docs/heads.md shows how to use them; docs/architecture.md lists the modules.
"""
