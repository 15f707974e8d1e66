"""The served checkpoint's weights as our modules bind them, registered per weights format in `arch.py`.

MAX looks an architecture's adapter up by the format of the checkpoint's files, as its own
architectures register theirs; GPT-2 comes as safetensors (Hugging Face's) or GGUF (llama.cpp's).
Both are read as `load_lm` reads them (`max_gpt2.model.checkpoints.checkpoint.open_checkpoint`: both key
layouts, Conv1D transposed, the head tied unless the config unties it, every shape checked, a GGUF
file's types checked) and bound as it binds them (`max_gpt2.model.checkpoints.weights_cache.bound_weights`:
converted once into the weights cache, memory-mapped), so a served checkpoint is refused with the
same messages and served with the same weights.
"""

from __future__ import annotations

from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint
from max_gpt2.model.checkpoints.stored_weights import StoredWeights, choose_format
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.formats import WeightFormat


def stored_state_dict(checkpoint: OpenedCheckpoint, weight_format: WeightFormat) -> StoredWeights:
    """The opened checkpoint's parameters as bound in `weight_format`; a quantized GGUF file serves in its
    own format or as float32 (`stored_weights.choose_format`)."""
    return bound_weights(checkpoint, choose_format(checkpoint, weight_format))
