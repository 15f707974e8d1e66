"""Weight formats: how the language model stores its projections, LM head and token embedding, one
object each.

A decoding step reads every weight once, so its speed is bytes of weights over memory bandwidth.
Besides float32, the projections, the LM head and the token embedding may be stored in fewer
bytes (a lookup unpacks the rows it takes; the sums stay float32; as in llama.cpp the kernels
round each product's input to bfloat16 against bfloat16 weights, to int8 blocks of 32 against
llama.cpp's blocks of 32, of 256 against the K-quants):

    float32   4 bytes a weight; the position embedding, biases and layer norms always stay so
    bfloat16  the top half of each float32 (round to nearest even), 2 bytes a weight
    q8_0      llama.cpp's blocks of 32 int8 values and a float16 scale, 1.0625 bytes a weight
    q4_0      llama.cpp's blocks of 32 4-bit values and a float16 scale, 0.5625 bytes a weight
    q4_1      its Q4_1: q4_0's with a float16 min a block, 0.625
    q5_0      its Q5_0: blocks of 32 5-bit values and a float16 scale, 0.6875
    q5_1      its Q5_1: q5_0's with a float16 min a block, 0.75
    q4_k      its Q4_K: super-blocks of 256, 4-bit values, 6-bit scales and mins, 0.578
    q5_k      its Q5_K: the same with 5-bit values, 0.703
    q6_k      its Q6_K: super-blocks of 256, 6-bit values, int8 scales per 16, 0.820

(`block_quants` has q8_0's and q4_0's arithmetic, `gguf_blocks` and `gguf_quantizers` the
others'.) `FORMATS` is the registry, by name; `format_named(name)` looks one up, refusing a name
it lacks with the list. A GGUF file mixing them (llama-quantize's presets, `gguf_mixes`) loads as
a `MixedFormat` (`mixed`), each tensor in its own. Checkpoints may also store GGUF's F16
(`FLOAT16`), which loads as the float32 values it stands for; `BY_GGML_TYPE` has every format a
GGUF file is read in (all in `registry`). A format knows (`format.TensorFormat`):

- its name, bytes a weight, llama.cpp's ggml type and `general.file_type`;
- `rows` / `values`: a weight [N, K] to and from the rows GGUF stores (float32, float16, bfloat16
  bits, or blocks of bytes);
- `stored` / `pack` / `unpack`: what a linear layer binds (a "weight", and "scales" for blocks), in
  the kernels' layout (`kernel_layout`), from those rows and back to float32;
- `kernel_format`: its code in the kernels (`max_gpt2/kernels/packed_layout.mojo`), the
  compile-time parameter of the Mojo ops that multiply by it or unpack it (`gpt2_matmul`,
  `gpt2_dequantize`); 0 for rows of floats;
- whether it runs only through the kernels (`kernels_only`: every format but float32, on the CPU
  in float32 compute; `check_runs`), is quantized (then it loads only as itself or as float32),
  and the KV cache's dtype beside it (`cache_dtype`: float16 by default beside a packed format).

A model's formats are a `WeightFormat`: one of these for every packed tensor, or a `MixedFormat`,
which answers what a model asks of it (`format_for`, `built_as`, the cache's dtype) and nothing a
single tensor's format is asked. No other module compares a format's name; each asks its format.
"""

from max_gpt2.model.formats.format import Stored, TensorFormat, WeightFormat
from max_gpt2.model.formats.mixed import MixedFormat, mixed
from max_gpt2.model.formats.registry import (
    BFLOAT16,
    BY_GGML_TYPE,
    FLOAT16,
    FLOAT32,
    FORMATS,
    NAMED,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    format_named,
)

__all__ = [
    "BFLOAT16",
    "BY_GGML_TYPE",
    "FLOAT16",
    "FLOAT32",
    "FORMATS",
    "NAMED",
    "Q4_0",
    "Q4_1",
    "Q4_K",
    "Q5_0",
    "Q5_1",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "MixedFormat",
    "Stored",
    "TensorFormat",
    "WeightFormat",
    "format_named",
    "mixed",
]
