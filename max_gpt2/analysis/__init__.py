"""What the attention heads do: a summary per head, and a gallery of heatmaps (`max-gpt2 heads`).

head_summary.py  previous-token, first-token, self and entropy averages, and a label per head
gallery.py       a heatmap per head, one colour scale, as PNG
"""
