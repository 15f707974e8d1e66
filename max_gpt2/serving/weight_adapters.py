"""The served checkpoint's tensors to our modules' parameters, registered per weights format in `arch.py`.

MAX looks an architecture's adapter up by the format of the checkpoint's files, as
its own architectures register theirs; GPT-2 comes as safetensors. The adapter is
the library's (`max_gpt2.model.weight_adapters.WeightAdapter`: both key layouts,
Conv1D transposed, the head tied to `wte` unless the config unties it, every shape
checked against `config.json`), so a served checkpoint is read as `load_lm` reads
it and refused with the same messages.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.weight_adapters import WeightAdapter


def convert_safetensor_state_dict(
    state_dict: Mapping[str, np.ndarray], config: GPT2Config, source: str
) -> dict[str, np.ndarray]:
    """A Hugging Face GPT-2 state dict (key -> float32 array, read lazily) as float32 MAX-layout
    parameters by module name; `source` names the files in errors."""
    return WeightAdapter(state_dict, config, source).model_weights()
