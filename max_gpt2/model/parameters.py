"""GPT-2's parameters by name: their shapes in MAX's layout and in a checkpoint, which are stored in
the chosen weight format (packed), and where a packed parameter's parts are bound (its "weight",
and "scales" for blocks)."""

from __future__ import annotations

import re

from max_gpt2.model.config import GPT2Config

PARAMETERS = ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
"""Parameters stored by Hugging Face as Conv1D `[in, out]`, transposed on reading."""

LAYER_PRODUCT = re.compile(r"(transformer\.h\.\d+)\.((?:attn|mlp)\.c_(?:attn|proj|fc))\.weight")
"""A block's projection's parameter name: its block and its product (`attn.c_attn`, ...)."""


def parameter_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Shapes of the attention parameters in MAX `Linear` layout, by parameter name."""
    d = config.n_embd
    return {
        "c_attn.weight": (3 * d, d),
        "c_attn.bias": (3 * d,),
        "c_proj.weight": (d, d),
        "c_proj.bias": (d,),
    }


def model_parameter_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every parameter of `GPT2LMHeadModel`, in MAX layout, by its module name."""
    d, inner, vocab = config.n_embd, config.mlp_width, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (vocab, d),
        "transformer.wpe.weight": (config.n_positions, d),
    }
    for layer in range(config.n_layer):
        h = f"transformer.h.{layer}."
        shapes |= {h + "ln_1.weight": (d,), h + "ln_1.bias": (d,)}
        shapes |= {h + "attn." + name: shape for name, shape in parameter_shapes(config).items()}
        shapes |= {
            h + "ln_2.weight": (d,),
            h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (inner, d),
            h + "mlp.c_fc.bias": (inner,),
            h + "mlp.c_proj.weight": (d, inner),
            h + "mlp.c_proj.bias": (d,),
        }
    return shapes | {
        "transformer.ln_f.weight": (d,),
        "transformer.ln_f.bias": (d,),
        "lm_head.weight": (vocab, d),
    }


def stored_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a checkpoint stores parameter `name` in: Conv1D weights are `[in, out]`."""
    return shape[::-1] if name.endswith(CONV1D_WEIGHTS) else shape


def is_packed(name: str) -> bool:
    """Whether parameter `name` is stored in the chosen format: the projections, the LM head and the
    token embedding (its lookup unpacks the rows it takes, `packed_linear.PackedEmbedding`)."""
    return name.endswith(CONV1D_WEIGHTS) or name in ("lm_head.weight", "transformer.wte.weight")


def stored_name(name: str, part: str) -> str:
    """Where part `part` ("weight", "scales") of packed parameter `name` (`...c_attn.weight`) is bound."""
    return name.removesuffix("weight") + part
