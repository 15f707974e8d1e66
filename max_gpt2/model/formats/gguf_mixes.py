"""llama-quantize's presets for GPT-2 (Q4_K_M, Q5_K_M, Q6_K): the type each tensor of a file takes.

`max-gpt2 convert --weight-format q4_k_m` writes what `llama-quantize F32.gguf OUT.gguf Q4_K_M`
makes of llama.cpp's own F32 file, tensor for tensor and byte for byte (llama.cpp's
`llama_tensor_get_type` for GPT-2; the quantizers are `gguf_quantizers`):

    token_embd (tied to the head), output   Q6_K; Q8_0 where a row is not whole blocks of the preset's type
    attn_qkv, ffn_down                      Q6_K in the layers `more_bits` names (Q4_K_M, Q5_K_M)
    the other projections, an untied        the preset's type
      token_embd
    position_embd, norms, biases            F32

A tensor whose rows are not whole 256-weight super-blocks falls back as llama-quantize's does:
Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0 (GPT-2 xl's 1600-wide inputs), and to F16 where a row
is not whole 32-weight blocks either.
"""

from __future__ import annotations

from dataclasses import dataclass

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import BY_GGML_TYPE, FLOAT16, FLOAT32, TensorFormat
from max_gpt2.model.parameters import is_packed, model_parameter_shapes

_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_MORE_BITS_PARTS = (".attn.c_attn.weight", ".mlp.c_proj.weight")  # llama.cpp's attn_qkv, ffn_down


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighths of the layers, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def fitting(weight_format: TensorFormat, columns: int) -> TensorFormat:
    """`weight_format`, or llama-quantize's fallback where a row of `columns` weights is not whole blocks."""
    if columns % weight_format.gguf_block[0] == 0:
        return weight_format
    fallback = BY_GGML_TYPE.get(_FALLBACK.get(weight_format.ggml_type, ""), FLOAT16)
    return fallback if columns % fallback.gguf_block[0] == 0 else FLOAT16


@dataclass(frozen=True, eq=False)
class Mix:
    """A llama-quantize preset: its name (llama.cpp's), `general.file_type`, the projections' type, and
    whether attn_qkv and ffn_down take Q6_K in the `more_bits` layers."""

    preset: str
    file_type: int
    base: TensorFormat
    more_bits: bool

    @property
    def name(self) -> str:
        """Ours: llama.cpp's in lower case."""
        return self.preset.lower()

    def __str__(self) -> str:
        return self.name

    def formats(self, config: GPT2Config, tied: bool) -> dict[str, TensorFormat]:
        """The format of each parameter the file stores, by our names in `model_parameter_shapes`' order;
        a tied head is `token_embd` and is left out."""
        six = BY_GGML_TYPE["Q6_K"]
        formats: dict[str, TensorFormat] = {}
        for name, shape in model_parameter_shapes(config).items():
            if len(shape) == 1 or name == "transformer.wpe.weight":
                formats[name] = FLOAT32
            elif name == "lm_head.weight" or (tied and name == "transformer.wte.weight"):
                whole = shape[1] % self.base.gguf_block[0] == 0
                formats[name] = six if whole else BY_GGML_TYPE["Q8_0"]
            elif is_packed(name) and self.more_bits and name.endswith(_MORE_BITS_PARTS):
                layer = int(name.split(".")[2])  # transformer.h.N...
                chosen = six if more_bits(layer, config.n_layer) else self.base
                formats[name] = fitting(chosen, shape[1])
            else:
                formats[name] = fitting(self.base, shape[1])
        if tied:
            del formats["lm_head.weight"]
        return formats


MIXES = {
    mix.name: mix
    for mix in (
        Mix("Q4_K_M", 15, BY_GGML_TYPE["Q4_K"], more_bits=True),
        Mix("Q5_K_M", 17, BY_GGML_TYPE["Q5_K"], more_bits=True),
        Mix("Q6_K", 18, BY_GGML_TYPE["Q6_K"], more_bits=False),
    )
}
"""llama-quantize's presets `max-gpt2 convert` writes, by our name (llama.cpp's in lower case)."""
