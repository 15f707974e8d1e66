"""Paged decoding attention alone: `gpt2_paged_attention` beside MAX's store + flash attention.

    python benchmarks/paged_attention.py                   # GPT-2 small's heads, CPU
    python benchmarks/paged_attention.py --cases 1x64,16x48 --layers 24 --heads 16

A decoding step of R requests, each with C tokens in MAX's paged KV cache (the
last one new), through every layer's attention: our kernel (store the new key
and value, attend, one call per layer) and MAX's ops the graph used before it
(`store_k_cache_ragged`, `store_v_cache_ragged`, `flash_attention_ragged`), on
the same cache from MAX's own KV-cache manager, alternated call by call. Reports
the median milliseconds per step, the ratio, and how far apart the two outputs
are. The cache holds random keys and values; positions do not matter to speed.
The server's decoding blocks (`gpt2_paged_decode_layer`) attend through the same
routine (`attend.mojo`) inside one op a block.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from max import tree
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, TensorType, ops
from max.nn.attention import MHAMaskVariant
from max.nn.kernels import flash_attention_ragged, store_k_cache_ragged, store_v_cache_ragged
from max.nn.kv_cache import KVCacheParams
from max.pipelines.context import TextContext
from max.pipelines.context.tokens import TokenBuffer
from max.pipelines.kv_cache import KVCacheConfig, load_kv_manager

from max_gpt2.bench.harness import machine_description
from max_gpt2.kernels import kernel_library

CPU_REF = DeviceRef.CPU()
HEAD_DIM = 64


def attention_graph(params: KVCacheParams, layers: int, heads: int, ours: bool) -> Graph:
    """qkv [R, 3D] and row offsets -> the sum over layers of each layer's attention [R, D]."""
    width = heads * HEAD_DIM
    inputs = [TensorType(DType.float32, ["T", 3 * width], CPU_REF), TensorType(DType.uint32, ["R1"], CPU_REF)]
    name = "ours" if ours else "max"
    with Graph(
        f"paged_attention_{name}",
        input_types=[*inputs, *params.flattened_kv_inputs()],
        custom_extensions=[kernel_library()],
    ) as graph:
        qkv, offsets, *kv = (value.tensor if i < 2 else value for i, value in enumerate(graph.inputs))
        (cache,) = params.unflatten_kv_inputs(iter(kv))
        total = None
        for layer in range(layers):
            if ours:
                index = ops.constant(np.array([layer], np.uint32), DType.uint32, CPU_REF)
                where = [cache.cache_lengths, cache.lookup_table, offsets, cache.page_stride, index]
                out_type = TensorType(DType.float32, [qkv.shape[0], width], CPU_REF)
                (attended,) = ops.inplace_custom(
                    "gpt2_paged_attention", CPU_REF, [cache.kv_blocks, qkv, *where], [out_type]
                )
            else:
                index = ops.constant(layer, DType.uint32, CPU_REF)
                query, key, value = (
                    t.reshape([-1, heads, HEAD_DIM]) for t in ops.split(qkv, [width] * 3, axis=-1)
                )
                store_k_cache_ragged(cache, key, offsets, index)
                store_v_cache_ragged(cache, value, offsets, index)
                scale = 1 / math.sqrt(HEAD_DIM)
                attended = flash_attention_ragged(
                    params, query, offsets, cache, index, MHAMaskVariant.CAUSAL_MASK, scale
                )
                attended = attended.reshape([-1, width])
            total = attended if total is None else total + attended
        graph.output(total)
    return graph


def decoding_cache(
    params: KVCacheParams, session: InferenceSession, requests: int, context: int
) -> list[Buffer]:
    """MAX's KV-cache inputs for `requests` requests with `context - 1` tokens cached and one new each."""
    manager = load_kv_manager(
        params=params, max_batch_size=requests, max_seq_len=max(1024, context), session=session,
        available_cache_memory=2 << 30, is_di_enabled=False, model_name="gpt2", max_num_input_tokens=8192,
    )  # fmt: skip
    contexts = [
        TextContext(max_length=max(1024, context), tokens=TokenBuffer(array=np.zeros(context, np.int64)))
        for _ in range(requests)
    ]
    for request in contexts:
        manager.claim(request, replica_idx=0)
        manager.alloc(request)
        request.tokens.skip_processing(context - 1)
    kv = tree.leaves(manager.runtime_inputs([contexts]))
    kv[0].to_numpy()[:] = np.random.default_rng(0).standard_normal(kv[0].shape, dtype=np.float32)
    return kv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="1x64,1x832,16x48,8x432", help="REQUESTSxCONTEXT, comma-separated")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--calls", type=int, default=30, help="timed calls of each per case (default: 30)")
    args = parser.parse_args()
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    params = KVCacheConfig().to_params(
        dtype=DType.float32, n_kv_heads=args.heads, head_dim=HEAD_DIM, num_layers=args.layers,
        devices=[CPU_REF], data_parallel_degree=1,
    )  # fmt: skip
    session = InferenceSession(devices=[CPU()])
    print(f"compiling both graphs ({args.layers} layers, {args.heads} heads of {HEAD_DIM}) ...", flush=True)
    models: dict[str, Model] = {
        name: session.load(attention_graph(params, args.layers, args.heads, ours=name == "ours"))
        for name in ("ours", "max")
    }
    print(f"{machine_description(CPU())}\n")
    print("| requests x context | gpt2_paged_attention ms | MAX store + flash ms | MAX / ours | difference |")
    print("|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(1)
    for requests, context in cases:
        kv = decoding_cache(params, session, requests, context)
        qkv = Buffer.from_numpy(rng.standard_normal((requests, 3 * args.heads * HEAD_DIM), dtype=np.float32))
        offsets = Buffer.from_numpy(np.arange(requests + 1, dtype=np.uint32))
        seconds: dict[str, list[float]] = {name: [] for name in models}
        outputs = {}
        for call in range(args.calls + 3):  # the first 3 warm up
            for name, model in models.items():
                start = time.perf_counter()
                outputs[name] = model.execute(qkv, offsets, *kv)[0].to_numpy()
                if call >= 3:
                    seconds[name].append(time.perf_counter() - start)
        ours, theirs = (1e3 * float(np.median(seconds[name])) for name in ("ours", "max"))
        difference = float(np.abs(outputs["ours"] - outputs["max"]).max())
        row = (
            f"| {requests} x {context} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f} | {difference:.1e} |"
        )
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
