"""`gpt2_decode_layer` and `gpt2_paged_decode_layer`, a whole GPT-2 block as one Mojo op on our cache
or MAX's pages, against a float64 NumPy block, in each format."""

from __future__ import annotations

import re

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import default_device, default_dtype
from max.graph import DeviceRef
from max.nn.kv_cache import KVCacheParams

from max_gpt2 import GPT2Config, reference
from max_gpt2.inference.devices import host_buffer
from max_gpt2.kernels.ops import layer_formats
from max_gpt2.model.formats import NAMED, Q4_K, Q6_K, Q8_0, mixed
from max_gpt2.model.layers.gpt2 import GPT2LMHeadModel, embedding_for, linear_for
from max_gpt2.model.layers.kernel_layers import KernelBlock, KernelLinear
from max_gpt2.model.layers.packed_linear import take_formats
from max_gpt2.model.layers.variants import DECODE, LAST_LOGITS_DECODE
from max_gpt2.model.parameters import is_packed, model_parameter_shapes
from max_gpt2.serving.paged_gpt2 import PagedGPT2LMHeadModel, PagedKernelBlock
from tests.op_graphs import LAYOUTS, SUPER_LAYOUTS
from tests.support import (
    LOWEST,
    attention_reference,
    bfloat16_activations,
    paged_attention_reference,
    quantized_activations,
    scattered_pages,
    super_block_activations,
)

CPU_REF = DeviceRef.CPU()
EPSILON = 1e-5


# The layouts a width of 256 allows besides: the K-quants (super-blocks of 256 weights), q4_k_m's mix,
# and llama.cpp's other blocks of 32 (whole blocks only) beside them, as GPT-2 xl's presets mix them.
SUPER = {
    "layouts": SUPER_LAYOUTS,
    "layer": "gpt2_decode_layer_super",
    "paged": "gpt2_paged_decode_layer_super",
}
ANY = {"layouts": LAYOUTS, "layer": "gpt2_decode_layer_alone", "paged": "gpt2_paged_decode_layer_alone"}


def stored_forms(w: np.ndarray, layouts: dict) -> dict[str, tuple[list[Buffer], np.ndarray]]:
    """W [N, K] as each format of `layouts` stores it (what the op takes) and the float64 weights it
    stands for."""
    forms = {}
    for name in {format for formats in layouts.values() for format in formats}:
        format = NAMED[name]
        stored = format.pack(format.rows(w))
        buffers = [
            host_buffer(stored[part], info.max_dtype) for part, info in format.stored(*w.shape).items()
        ]
        forms[name] = (buffers, format.unpack(stored, *w.shape).astype(np.float64))
    return forms


def random_block(rng, width, wide, layouts=LAYOUTS):
    """A block's random parameters: ln_1's and ln_2's weight and bias, each product's bias [N], and
    each product's weight W [N, K] in every format of `layouts` (`stored_forms`)."""
    norms = [1 + 0.1 * rng.standard_normal(width, dtype=np.float32) for _ in range(2)]
    norms = [norms[0], rng.standard_normal(width, dtype=np.float32), norms[1], np.zeros(width, np.float32)]
    shapes = [(3 * width, width), (width, width), (wide, width), (width, wide)]
    ws = [(rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32) for shape in shapes]
    biases = [rng.standard_normal(shape[0], dtype=np.float32) for shape in shapes]
    return norms, biases, [stored_forms(w, layouts) for w in ws]


def parameters(norms, biases, forms, layouts=LAYOUTS) -> list[Buffer]:
    """What the layer graphs take after their lead inputs (`op_graphs.layer_graph`)."""
    shared = [*norms, np.array([EPSILON], np.float32), *biases, np.zeros((0, 0), np.float16)]
    stored = [
        buffer
        for formats in layouts.values()
        for form, format in zip(forms, formats, strict=True)
        for buffer in form[format][0]
    ]
    return [*map(Buffer.from_numpy, shared), *stored]


ROUNDED = {
    "bfloat16": bfloat16_activations,
    "q8_0": quantized_activations,
    "q4_0": quantized_activations,
    "q4_1": quantized_activations,
    "q5_0": quantized_activations,
    "q5_1": quantized_activations,
    "q4_k": super_block_activations,
    "q5_k": super_block_activations,
    "q6_k": super_block_activations,
}
"""How each format's kernels round a product's input: bfloat16, int8 blocks of 32 (q8_0's, before every
block of 32) or of 256 (q8_K's); float32 reads it as it is."""


def block_reference(x, attend, norms, weights, biases, formats):
    """x + attn(ln_1(x)), then + mlp(ln_2(.)) in float64 on the weights stored in `formats` (one a
    product); `attend(qkv)` gives the attended values and the cache it wrote; each product's input
    rounded first as its format's kernels round it (`ROUNDED`)."""

    def product(a, i):
        flat = a.reshape(-1, a.shape[-1])
        rounding = ROUNDED.get(formats[i])
        flat = rounding(flat.astype(np.float32)) if rounding else flat
        return (flat @ weights[i].T + biases[i]).reshape(*a.shape[:-1], -1)

    x = x.astype(np.float64)
    qkv = product(reference.layer_norm(x, norms[0], norms[1], EPSILON), 0)
    attended, cache = attend(qkv)
    x = x + product(attended, 1)
    hidden = reference.activation(product(reference.layer_norm(x, norms[2], norms[3], EPSILON), 2))
    return x + product(hidden, 3), cache


@pytest.mark.parametrize(
    ("batch", "new", "total", "cache_len", "heads", "head_dim", "wide", "kind"),
    [
        (1, 1, 9, 12, 2, 64, 512, ANY),  # a decoding step, GPT-2's head size (kept in registers)
        (3, 1, 7, 8, 5, 12, 240, ANY),  # a batch of steps with padding, a block tail in every product
        (2, 4, 6, 10, 3, 20, 100, ANY),  # several new tokens after a past; the MLP's width a ragged group
        (1, 1, 9, 12, 4, 64, 512, SUPER),  # a decoding step in super-blocks: two of them a row of c_proj
        (2, 5, 7, 8, 8, 32, 1024, SUPER),  # a batch of several tokens: 8, then 2 rows of x at a time
    ],
)
def test_the_layer_matches_a_float64_block_in_every_format(
    compiled_ops, batch, new, total, cache_len, heads, head_dim, wide, kind
):
    """Each layout's y and the keys and values it writes, on the weights it stores."""
    layer, layouts = compiled_ops[kind["layer"]], kind["layouts"]
    width = heads * head_dim
    rng = np.random.default_rng(total * batch + new)
    x = rng.standard_normal((batch, new, width), dtype=np.float32)
    cache = rng.standard_normal((2, batch, heads, cache_len, head_dim), dtype=np.float32)
    key_bias = np.where(rng.random((batch, total)) < 0.3, LOWEST, 0).astype(np.float32)
    key_bias[:, total - new :] = 0  # the new tokens are real
    norms, biases, forms = random_block(rng, width, wide, layouts)
    written = [Buffer.from_numpy(cache.copy()) for _ in layouts]
    outputs = layer.execute(
        *written, *map(Buffer.from_numpy, [x, key_bias]), *parameters(norms, biases, forms, layouts)
    )
    for (name, formats), out, cache_out in zip(layouts.items(), outputs, written, strict=True):
        weights = [form[format][1] for form, format in zip(forms, formats, strict=True)]

        def attend(qkv):
            return attention_reference(cache, qkv, key_bias, heads)

        expected, expected_cache = block_reference(x, attend, norms, weights, biases, formats)
        # float32 against float64 may round a product's input to the other int8 or bfloat16 step
        tolerance = 2e-6 if name == "float32" else 1e-3
        got = out.to_numpy()
        assert np.abs(got - expected).max() <= tolerance * np.abs(expected).max(), name
        np.testing.assert_allclose(
            cache_out.to_numpy()[..., :total, :], expected_cache[..., :total, :], atol=1e-5
        )
        np.testing.assert_array_equal(cache_out.to_numpy()[..., total:, :], cache[..., total:, :])


@pytest.mark.parametrize(
    ("cached", "new", "page_size", "heads", "head_dim", "wide", "stride", "kind"),
    [
        ([0, 7, 3], 1, 4, 2, 64, 512, -1, ANY),  # GPT-2's head size; a one-token prompt; pages crossed
        ([5, 16, 30, 1, 9], 1, 16, 5, 12, 240, "packed", ANY),  # a page begun; an explicit page stride
        ([0, 7, 3], 1, 4, 4, 64, 768, -1, SUPER),  # super-blocks: 3 rows of x, as 2 and 1
        ([6, 2], 5, 4, 2, 64, 512, -1, ANY),  # a last token and a draft of 4 each: pages crossed
        ([3, 11], 3, 4, 4, 64, 768, "packed", SUPER),  # the same in super-blocks, 6 rows of x
    ],
)
def test_the_paged_layer_matches_a_float64_block_in_every_format(
    compiled_ops, cached, new, page_size, heads, head_dim, wide, stride, kind
):
    """Each format's y [R * S, D] for S tokens a request, and the S slots a request it writes in the
    layer's keys and values on that request's own pages."""
    width, requests, layer_index = heads * head_dim, len(cached), 1
    rng = np.random.default_rng(sum(cached) + page_size + new)
    blocks, lookup = scattered_pages(rng, cached, [new] * requests, page_size, heads, head_dim)
    x = rng.standard_normal((requests * new, width), dtype=np.float32)
    offsets, cached = np.arange(requests + 1, dtype=np.uint32) * new, np.array(cached, np.uint32)
    page_stride = blocks[0].size if stride == "packed" else stride
    layer, layouts = compiled_ops[kind["paged"]], kind["layouts"]
    norms, biases, forms = random_block(rng, width, wide, layouts)
    written = [Buffer.from_numpy(blocks.copy()) for _ in layouts]
    lead = [x, cached, lookup, offsets, np.array([page_stride], np.int64), np.array([layer_index], np.uint32)]
    outputs = layer.execute(
        *written, *map(Buffer.from_numpy, lead), *parameters(norms, biases, forms, layouts)
    )
    for (name, formats), out, blocks_out in zip(layouts.items(), outputs, written, strict=True):
        weights = [form[format][1] for form, format in zip(forms, formats, strict=True)]

        def attend(qkv):
            return paged_attention_reference(blocks, qkv, cached, lookup, offsets, layer_index, heads)

        expected, expected_blocks = block_reference(x, attend, norms, weights, biases, formats)
        tolerance = 2e-6 if name == "float32" else 1e-3
        got = out.to_numpy()
        assert np.abs(got - expected).max() <= tolerance * np.abs(expected).max(), name
        np.testing.assert_allclose(blocks_out.to_numpy(), expected_blocks, rtol=0, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    ("tokens", "offsets", "message"),
    [
        (2, [0, 0, 2], "request 1 starts at token 0, not 1: the step's 2 tokens are 1 a request"),
        (3, [0, 1, 3], "3 tokens are not the same number for each of 2 requests"),
    ],
)
def test_the_paged_layer_refuses_a_step_whose_requests_bring_different_numbers_of_tokens(
    compiled_ops, tokens, offsets, message
):
    """Two rows as one request's two tokens, or three as one and two: refused before anything is written."""
    rng = np.random.default_rng(0)
    blocks, lookup = scattered_pages(rng, [3, 3], [2, 2], 4, 2, 8)
    norms, biases, forms = random_block(rng, 16, 64)
    written = [Buffer.from_numpy(blocks.copy()) for _ in LAYOUTS]
    paged_layer = compiled_ops["gpt2_paged_decode_layer_alone"]
    x, cached = np.ones((tokens, 16), np.float32), np.array([3, 3], np.uint32)
    lead = [
        x,
        cached,
        lookup,
        np.array(offsets, np.uint32),
        np.array([-1], np.int64),
        np.array([0], np.uint32),
    ]
    with pytest.raises(Exception, match=re.escape(message)):
        paged_layer.execute(*written, *map(Buffer.from_numpy, lead), *parameters(norms, biases, forms))
    np.testing.assert_array_equal(written[0].to_numpy(), blocks)


def test_a_paged_step_of_several_tokens_a_request_is_its_one_token_steps_bit_for_bit(compiled_ops):
    """Each request's last token and a draft of 3 in one call give the y rows and cache slots that
    four one-token calls give, one after another, in every format: a drafted token a server keeps
    is what a step without drafts would have made of it."""
    rng = np.random.default_rng(7)
    cached, new, page_size, heads, head_dim = [5, 9], 4, 4, 2, 64
    width, requests = heads * head_dim, len(cached)
    blocks, lookup = scattered_pages(rng, cached, [new] * requests, page_size, heads, head_dim)
    x = rng.standard_normal((requests, new, width), dtype=np.float32)
    norms, biases, forms = random_block(rng, width, 512)
    paged_layer = compiled_ops["gpt2_paged_decode_layer_alone"]

    def run(rows, past, written):
        step = len(rows) // requests
        offsets = np.arange(requests + 1, dtype=np.uint32) * step
        lead = [
            rows,
            np.array(past, np.uint32),
            lookup,
            offsets,
            np.array([-1], np.int64),
            np.array([1], np.uint32),
        ]
        return [
            out.to_numpy()
            for out in paged_layer.execute(
                *written, *map(Buffer.from_numpy, lead), *parameters(norms, biases, forms)
            )
        ]

    together = [Buffer.from_numpy(blocks.copy()) for _ in LAYOUTS]
    at_once = run(x.reshape(-1, width), cached, together)
    alone = [Buffer.from_numpy(blocks.copy()) for _ in LAYOUTS]
    one_by_one = [run(x[:, s], [c + s for c in cached], alone) for s in range(new)]
    for i, name in enumerate(LAYOUTS):
        stepped = np.stack([outputs[i] for outputs in one_by_one], axis=1).reshape(-1, width)  # [R * S, D]
        np.testing.assert_array_equal(at_once[i], stepped, err_msg=name)
        np.testing.assert_array_equal(together[i].to_numpy(), alone[i].to_numpy(), err_msg=name)


@pytest.mark.parametrize(("activation", "fused"), [("gelu_new", True), ("gelu_fast", True), ("gelu", False)])
def test_only_blocks_with_the_kernels_activation_become_one_op(activation, fused):
    """The step graph (kernels) makes `KernelBlock`s, and the server's decoding graph `PagedKernelBlock`s,
    where the MLP's activation is GELU's tanh form, which the decode-layer ops compute; other
    activations and the other graphs keep `Block`."""
    config = GPT2Config(n_embd=8, n_head=2, n_layer=2, activation_function=activation)
    with F.lazy(), default_device(CPU()), default_dtype(DType.float32):
        step = GPT2LMHeadModel(config, DECODE, Q8_0)
        plain = GPT2LMHeadModel(config)
    assert [isinstance(block, KernelBlock) for block in step.transformer.h] == [fused] * 2
    assert not any(isinstance(block, KernelBlock) for block in plain.transformer.h)
    kv_params = KVCacheParams(dtype=DType.float32, head_dim=4, num_layers=2, devices=[CPU_REF])
    with F.lazy(), default_device(CPU()), default_dtype(DType.float32):
        decoding = PagedGPT2LMHeadModel(config, kv_params, LAST_LOGITS_DECODE, KernelLinear)
        general = PagedGPT2LMHeadModel(config, kv_params, linear=KernelLinear)
    assert [isinstance(block, PagedKernelBlock) for block in decoding.transformer.h] == [fused] * 2
    assert not any(isinstance(block, PagedKernelBlock) for block in general.transformer.h)


def test_a_mix_of_formats_gives_each_packed_module_its_tensors_format():
    """`take_formats`, as the in-process model and the server's build theirs: a Q4_K_M-like mix (q6_k
    c_attn and mlp c_proj in layer 0, the tied head and embedding, q4_k the rest) reaches every
    `PackedLinear`, each bound as its own format stores it, and each layer's decode-layer op gets its
    products' codes."""
    config = GPT2Config(n_embd=256, n_head=4, n_layer=2, n_positions=8, vocab_size=16)
    six = {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.weight", "lm_head.weight"}
    six |= {"transformer.wte.weight"}  # tied: the head's table
    names = [name for name in model_parameter_shapes(config) if is_packed(name)]
    mix = mixed({name: Q6_K if name in six else Q4_K for name in names})
    kv_params = KVCacheParams(dtype=DType.float32, head_dim=64, num_layers=2, devices=[CPU_REF])
    with F.lazy(), default_device(CPU()), default_dtype(DType.float32):
        models = [
            GPT2LMHeadModel(config, DECODE, mix),
            PagedGPT2LMHeadModel(
                config, kv_params, LAST_LOGITS_DECODE, linear_for(mix, kernels=True), embedding_for(mix)
            ),
        ]
        take_formats(models[1], mix)  # as the server's pipeline model does after building it
    for model in models:
        modules = dict(model.descendants)
        for name in names:
            module = modules[name.removesuffix(".weight")]
            assert module.format is mix.format_for(name), name
            stored = mix.format_for(name).stored(module.out_dim, module.in_dim)
            assert list(module.weight.shape) == list(stored["weight"].shape), name
        codes = [layer_formats(block.layer_parameters()) for block in model.transformer.h]
        assert codes[0] == {"qkv_format": 4, "out_format": 3, "fc_format": 3, "down_format": 4}
        assert codes[1] == dict.fromkeys(codes[1], 3)
