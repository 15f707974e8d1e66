"""How fast this machine streams weights, and how many a decoding step streams: the two halves of
`max-gpt2 bench-generate`'s limit (tokens/s = bandwidth / bytes per step; see
`max_gpt2.bench.generation`).

The bandwidth is how fast GPT-2 small's LM head (float32 [50257, 768], 154 MB, far larger than any
cache) is read: on the host the fastest of a plain read (MAX's sum of it) and two matrix-vector
products with it (NumPy's and our `skinny_matmul`), so the limit is the machine's, not our
kernel's; on an accelerator a MAX matrix-vector product there. Best of several calls each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from max.driver import CPU, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

from max_gpt2.inference.threads import quiet_restless_threads
from max_gpt2.kernels import kernel_library
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32, WeightFormat
from max_gpt2.model.formats.kernel_layout import GROUP


def weight_bytes_per_step(config: GPT2Config, weights: WeightFormat = FLOAT32) -> int:
    """Bytes of weights one batch-1 decoding step reads (see the module docstring), the projections,
    the LM head and the token embedding in `weights` (`max_gpt2.model.formats.NAMED`: a compute
    dtype's too)."""
    width, inner = config.n_embd, config.mlp_width
    packed = 3 * width * width + width * width + width * inner + inner * width  # a block's projections
    plain = 2 * 2 * width + 3 * width + width + inner + width  # its layer norms and biases
    head = config.vocab_size * width  # the tied LM head reads all of wte
    per_weight = weights.bytes_per_weight
    # a token's wte rows: packed, the group of 8 it lies in, else its own row in float32
    looked_up = GROUP * width * per_weight if weights.kernels_only else width * 4
    float32 = (config.n_layer * plain + 2 * width + width) * 4  # ln_f, and a row of wpe
    return round((config.n_layer * packed + head) * per_weight + looked_up) + float32


def lm_head_operands() -> tuple[np.ndarray, np.ndarray]:
    """GPT-2 small's LM head [50257, 768] (154 MB, far larger than any cache) and one row [1, 768]."""
    config = GPT2Config()
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((config.vocab_size, config.n_embd), dtype=np.float32)
    return matrix, rng.standard_normal((1, config.n_embd), dtype=np.float32)


def best_seconds(product: Callable[[], Any], repeat: int) -> float:
    """The fastest of `repeat` calls of `product`, after two untimed ones (they fault pages in and
    fill the TLB: not the steady state)."""
    product(), product()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
    return best


BandwidthProbe = Callable[[int], dict[str, float]]
"""`probe(repeat)`: bytes per second at which GPT-2's LM head is read, best of `repeat` calls, by
each way the probe knows; made once, called as often as wanted (seconds a call)."""

SUM_ROWS = 64
"""Rows the plain read sums the head's values in: enough for every core, each a long contiguous run
(fewer or more rows read no faster)."""


def plain_read_graph(shape: tuple[int, ...]) -> Graph:
    """A MAX graph that sums a float32 array of `shape` in `SUM_ROWS` rows: one read of every byte,
    no weights' layout or products of ours."""
    with Graph("plain_read", input_types=[TensorType(DType.float32, shape, DeviceRef.CPU())]) as graph:
        values = graph.inputs[0].tensor.reshape([SUM_ROWS, -1])
        graph.output(ops.sum(values, axis=-1))
    return graph


def skinny_matmul_graph() -> Graph:
    """`skinny_matmul` (`gpt2_matmul` on rows of float32) alone, for the CPU: x [M, K], W [N, K] and a bias
    [N] (or [0]: none) in, y [M, N] out (all symbolic)."""
    cpu = DeviceRef.CPU()
    types = [TensorType(DType.float32, shape, cpu) for shape in (["M", "K"], ["N", "K"], ["B"])]
    with Graph("skinny_matmul_alone", input_types=types, custom_extensions=[kernel_library()]) as graph:
        x, w, bias = (value.tensor for value in graph.inputs)
        out = TensorType(DType.float32, [x.shape[0], w.shape[0]], cpu)
        no_scales = ops.constant(np.zeros((0, 0), np.float16), DType.float16, cpu)  # rows of floats have none
        graph.output(*ops.custom("gpt2_matmul", cpu, [x, w, no_scales, bias], [out], {"format": 0}))
    return graph


def host_bandwidth_probe() -> BandwidthProbe:
    """The host's, three ways: a plain read (MAX's sum), NumPy's product and our `skinny_matmul`
    (`max_gpt2.kernels`), so the limit is the fastest stream of those bytes this machine gives."""
    matrix, vector = lm_head_operands()
    session = InferenceSession(devices=[CPU()])
    kernel, reader = session.load(skinny_matmul_graph()), session.load(plain_read_graph(matrix.shape))
    weights, row = Buffer.from_numpy(matrix), Buffer.from_numpy(vector)
    no_bias = Buffer.from_numpy(np.zeros(0, np.float32))
    kernel.execute(row, weights, no_bias)  # MAX starts its restless thread at a first execution:
    quiet_restless_threads()  # out of the way, as a compiled model has it after its first run
    products = {
        "plain-read": lambda: reader.execute(weights),
        "numpy": lambda: matrix @ vector[0],
        "skinny_matmul": lambda: kernel.execute(row, weights, no_bias),
    }

    def probe(repeat: int) -> dict[str, float]:
        bandwidth = {}
        for name, product in products.items():
            # The other runtime's threads spin a while after their last call (OpenBLAS's, MAX's) and
            # take a core from this one's: a pause lets them stop, and the figures rise.
            time.sleep(0.5)
            bandwidth[name] = matrix.nbytes / best_seconds(product, repeat)
        return bandwidth

    return probe


def accelerator_bandwidth_probe(device: Device) -> BandwidthProbe:
    """`device`'s (an accelerator), a MAX graph there: the host's bandwidth says nothing of its memory."""
    matrix, vector = lm_head_operands()
    where = DeviceRef.from_device(device)
    types = [TensorType(DType.float32, array.shape, where) for array in (vector, matrix)]
    with Graph("lm_head_matvec", input_types=types) as graph:
        row, weights = (value.tensor for value in graph.inputs)
        graph.output(row @ weights.T)  # [1, 768] @ [768, 50257]
    model = InferenceSession(devices=[device]).load(graph)
    operands = [Buffer.from_numpy(array).to(device) for array in (vector, matrix)]

    def product() -> None:
        model.execute(*operands)
        device.synchronize()  # the call returns before the accelerator is done

    return lambda repeat: {"max-matmul": matrix.nbytes / best_seconds(product, repeat)}


def bandwidth_probe(device: Device) -> BandwidthProbe:
    """The probe for `device`: the host's three ways, or a graph on an accelerator."""
    return host_bandwidth_probe() if device.is_host else accelerator_bandwidth_probe(device)


def host_bandwidth(repeat: int = 20) -> dict[str, float]:
    """The host's bandwidth by each way, once (`host_bandwidth_probe`)."""
    return host_bandwidth_probe()(repeat)
