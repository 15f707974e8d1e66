"""Where the time goes: the two projections against the attention core, MAX and PyTorch.

    python benchmarks/breakdown.py                 # GPT-2 small, 1 x 1024 tokens, CPU float32
    python benchmarks/breakdown.py --model xl --shape 8x256 --repeat 20

Times, interleaved like `max-gpt2 bench`, each full implementation and a
projections-only version of it (`c_attn` then `c_proj`, the same two matrix
multiplies with nothing between them). The difference is the attention core:
splitting heads, scores, mask, softmax, the weighted sum and merging heads.
PyTorch is needed for its half of the table. The MAX projections graph is one
more graph to compile (about a minute the first time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from max.driver import CPU
from max.dtype import DType
from max.engine import InferenceSession
from max.experimental import functional as F
from max.experimental.tensor import Tensor, TensorType, default_device, default_dtype

from max_gpt2 import GPT2Attention, compile_attention
from max_gpt2.bench.attention import MODELS, parse_shapes
from max_gpt2.bench.attention_contenders import torch_contenders
from max_gpt2.bench.harness import settle, torch_skip_reason
from max_gpt2.inference.devices import to_buffer, to_numpy
from max_gpt2.model.config import GPT2Config
from max_gpt2.testing import random_attention_weights


class ProjectionsOnly(GPT2Attention):
    """`c_attn` then `c_proj` on the first third of its output: the attention's matrix multiplies."""

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.c_attn(x)[:, :, : self.n_embd])


def max_projections(config: GPT2Config, weights: dict[str, np.ndarray]):
    with F.lazy(), default_device(CPU()), default_dtype(DType.float32):
        module = ProjectionsOnly(config)
    staged = module.trace(TensorType(DType.float32, ("batch", "seq", config.n_embd), device=CPU()))
    session = InferenceSession(devices=[CPU()])
    registry = {name: to_buffer(array, DType.float32, CPU()) for name, array in weights.items()}
    model = session.init(session.compile(staged.graph), weights_registry=registry)
    return lambda x: to_numpy(model.execute(to_buffer(x, DType.float32, CPU()))[0])


def torch_projections(weights: dict[str, np.ndarray], width: int):
    import torch

    c_attn_w, c_attn_b, c_proj_w, c_proj_b = (
        torch.from_numpy(weights[name])
        for name in ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")
    )

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            qkv = torch.nn.functional.linear(torch.from_numpy(x), c_attn_w, c_attn_b)
            return torch.nn.functional.linear(qkv[..., :width], c_proj_w, c_proj_b).numpy()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", choices=list(MODELS))
    parser.add_argument("--shape", default="1x1024", help="batch x seq")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if reason := torch_skip_reason(CPU()):
        raise SystemExit(f"breakdown compares with PyTorch: {reason}")
    config = MODELS[args.model]
    ((batch, seq_len),) = parse_shapes(args.shape)
    weights = random_attention_weights(config, 0)
    calls = {impl: compile_attention(config, weights, "cpu", "float32", impl) for impl in ("graph", "flash")}
    calls["MAX projections"] = max_projections(config, weights)
    peers = argparse.Namespace(impls=["torch-sdpa", "torch-eager"], dtype="float32")
    calls.update({c.name: c.call for c in torch_contenders(config, weights, peers, CPU())})
    calls["torch projections"] = torch_projections(weights, config.n_embd)
    x = np.random.default_rng(0).standard_normal((batch, seq_len, config.n_embd), dtype=np.float32)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeat):
        for name, call in calls.items():
            settle(call, x)
            start = time.perf_counter()
            call(x)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(seconds) * 1e3 for name, seconds in times.items()}
    print(f"GPT-2 {args.model}, {batch}x{seq_len}, CPU float32, median of {args.repeat} interleaved rounds")
    print("| impl | total ms | projections ms | attention core ms |")
    print("|---|---:|---:|---:|")
    for name, projections in (
        ("graph", "MAX"),
        ("flash", "MAX"),
        ("torch-sdpa", "torch"),
        ("torch-eager", "torch"),
    ):
        shared = median[f"{projections} projections"]
        print(f"| {name} | {median[name]:.2f} | {shared:.2f} | {median[name] - shared:.2f} |")


if __name__ == "__main__":
    main()
