"""A serving step without the server: MAX's pipeline for our architecture beside `CompiledLM`, in one process.

    python benchmarks/serving_step.py --checkpoint DIR [--batches 1,8] [--steps 60] [--weights q4_0]

Builds the text-generation pipeline `max serve` runs (our architecture, MAX's
paged KV cache, scheduler left out) and, on the same checkpoint, `load_lm`'s
`CompiledLM`; then, for each batch size, decodes greedily step by step,
alternating three things at the same context: a pipeline step as served
(`GPT2TextGenerationPipeline`: batch inputs, the graph, the argmax on the host; one
token a step, as `max-gpt2 serve --decode-steps 1`),
the same step through MAX's stock `TextGenerationPipeline._execute` (its sampler
graph instead of the argmax), and one `CompiledLM.decode_step`. Prints the median
ms of each, and of the pipeline's graph call alone, so what a served token costs
beyond the model splits into the graph and the rest of `execute`; what the
server adds beyond that (scheduler, HTTP, processes) is the difference with
`benchmarks/serving.py`'s inter-token latency. CPU, float32 compute; `--weights` packs
the projections and the LM head for both (`max-gpt2 serve --weights`), `CompiledLM` then
with a float32 KV cache like the server's paged one.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import CPU, DeviceSpec
from max.pipelines import PIPELINE_REGISTRY, PipelineArgs, PipelineConfig
from max.pipelines.context.sampling_params import SamplingParams
from max.pipelines.lib import TextGenerationPipeline
from max.pipelines.modeling.types import TextGenerationInputs, TextGenerationRequest
from max.pipelines.request.base import RequestID

from max_gpt2.bench.harness import machine_description
from max_gpt2.cli.serve import require_serve_extra
from max_gpt2.inference.lm import load_lm
from max_gpt2.model.weight_formats import FORMATS, SERVED_FORMAT_VARIABLE
from max_gpt2.serving import ARCHITECTURES
from max_gpt2.serving.pipeline import DECODE_STEPS_VARIABLE
from max_gpt2.testing import CORPUS


def timed(call: Callable[..., Any], times: list[float]) -> Callable[..., Any]:
    """`call`, appending the seconds each call takes to `times`."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = call(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return result

    return wrapper


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="GPT-2 checkpoint with a tokenizer")
    parser.add_argument("--batches", default="1,8", help="requests decoded together (default: 1,8)")
    parser.add_argument("--steps", type=int, default=60, help="decoding steps per batch (default: 60)")
    parser.add_argument("--weights", default="float32", choices=FORMATS, help="(default: float32)")
    args = parser.parse_args()
    batches = [int(batch) for batch in args.batches.split(",")]
    require_serve_extra()
    for arch in ARCHITECTURES:
        PIPELINE_REGISTRY.register(arch)
    os.environ[SERVED_FORMAT_VARIABLE] = args.weights  # how `max-gpt2 serve` hands the server its format
    # One token an `execute`, so a served step, its graph call and a `decode_step` each make one token
    # (the server's several a scheduler step are `benchmarks/serving.py --decode-steps`).
    os.environ[DECODE_STEPS_VARIABLE] = "1"
    settings = PipelineArgs.from_flat_kwargs(
        model_path=str(args.checkpoint),
        device_specs=[DeviceSpec.cpu()],
        quantization_encoding="float32",
        enable_echo=True,  # as `max-gpt2 serve` starts it
        enable_prefix_caching=False,
        max_batch_size=max(batches),
    )
    tokenizer, pipeline = PIPELINE_REGISTRY.retrieve(PipelineConfig.from_args(settings))
    model, kv = pipeline._pipeline_model, pipeline._kv_manager
    lm = load_lm(args.checkpoint, "cpu", "float32", weights=args.weights, kv_cache="float32")
    prompt = " ".join(CORPUS.read_text().split()[:24])
    print(machine_description(CPU()))
    print(
        "| batch | execute ms, as served | its graph ms | rest of execute ms"
        " | execute ms, MAX's sampler | CompiledLM decode_step ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    served = pipeline.execute
    with_sampler = functools.partial(TextGenerationPipeline._execute, pipeline)  # MAX's own step
    for batch in batches:
        contexts = []
        for _ in range(batch):
            request = TextGenerationRequest(
                request_id=RequestID(),
                model_name="gpt2",
                prompt=prompt,
                sampling_params=SamplingParams(
                    temperature=0, max_new_tokens=2 * args.steps + 1, ignore_eos=True
                ),
            )
            context = asyncio.run(tokenizer.new_context(request))
            kv.claim(context, replica_idx=0)
            contexts.append(context)
        prompt_ids = np.tile(contexts[0].tokens.all, (batch, 1))
        cache = lm.new_cache(batch, prompt_ids.shape[1] + 2 * args.steps)
        lm.prefill(prompt_ids, cache)
        steps, graphs, sampled_steps, lm_steps = [], [], [], []
        model.execute = timed(type(model).execute.__get__(model), graphs)
        for _ in range(args.steps):
            for execute, times in ((served, steps), (with_sampler, sampled_steps)):
                for context in contexts:
                    kv.alloc(context)
                timed(execute, times)(TextGenerationInputs(batches=[contexts]))
            timed(lm.decode_step, lm_steps)(np.full(batch, 5), cache)
        del model.execute
        for context in contexts:
            kv.release(context)
        step, graph, sampled, alone = (
            # graphs: the served step's call, then the sampler step's, each round; the served ones timed
            1e3 * statistics.median(t[2:])
            for t in (steps, graphs[0::2], sampled_steps, lm_steps)
        )
        print(
            f"| {batch} | {step:.1f} | {graph:.1f} | {step - graph:.1f} | {sampled:.1f} | {alone:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
