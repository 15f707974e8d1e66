"""The pipeline model `max serve` drives: reads our checkpoint, compiles `PagedGPT2LMHeadModel`.

On the CPU in float32 it compiles two graphs over the same weights (as one
module, so the kernels they share compile once), as `CompiledLM` keeps a prefill
and a step graph: a decoding one (each block one `gpt2_paged_decode_layer` op,
its projections in `skinny_matmul`'s loops) for steps where each of at most
`SKINNY_ROWS` requests brings one token (and for prompt lookup's drafts to check,
`CheckedDrafts`), and the general one (MAX's flash
attention; `skinny_matmul` up to `SKINNY_ROWS` rows, MAX's matmul past them) for
the rest; elsewhere only the general one, with MAX's ops. With packed weights
(`GPT2ServingConfig.weight_format`: any of `formats.FORMATS` but float32, or
a GGUF file's mix; CPU and float32 only) both graphs take every projection and the
LM head through the packed kernels (`PackedLinear`), prompts too, as `CompiledLM`
does; the paged cache stays float32.

MAX's `ModuleV3PipelineModelWithKVCache` does the rest: it sizes and manages the
paged KV cache, batches requests into ragged inputs (MAX's own batch processor
and inputs, shared with its Llama 3 architecture: tokens, row offsets, the
flattened cache) and runs a graph once per step; `GPT2TextGenerationPipeline`
picks the tokens. MAX's ragged log-probability graph, built here with room for 31
alternatives a token (MAX's own `LogProbabilitiesMixin` builds it for 7; vLLM gives up to
20), answers OpenAI's `logprobs` from the graph's logits, and with `echo` the prompt's
too, from every token's logits (a server started with `--enable-echo`, as `max-gpt2 serve`
starts it). Such a server compiles the general graph a second time returning only
each request's last logits, for the prompt steps where no request asks for
log-probabilities: the LM head over every prompt token would cost those steps
time (docs/performance.md).

The checkpoint (a directory of safetensors, or a GGUF file given as MAX's weight path) is
opened by the library's `open_checkpoint` and its weights taken by the adapter `arch.py`
registers for its format, the way `load_lm` takes them (converted once into the weights
cache, memory-mapped); `weight_buffers` binds them as `CompiledLM` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from max import tree
from max.driver import CPU, Buffer
from max.engine import InferenceSession, Model
from max.experimental import functional as F
from max.experimental.compilation import CompiledCallable
from max.experimental.tensor import default_dtype
from max.graph import DeviceRef
from max.nn.kv_cache import KVCacheInputs, KVCacheInputsPerDevice
from max.nn.transformer import ReturnLogits
from max.pipelines.architectures.llama3_modulev3.batch_processor import Llama3ModuleV3BatchProcessor
from max.pipelines.architectures.llama3_modulev3.inputs import Llama3Inputs
from max.pipelines.context import LogProbabilities, TextContext
from max.pipelines.lib import ModelInputs, ModelOutputs, ModuleV3PipelineModelWithKVCache
from max.pipelines.lib.log_probabilities import (
    compute_log_probabilities_ragged,
    log_probabilities_ragged_graph,
)
from max.profiler import traced

from max_gpt2.inference.compiled import compile_together
from max_gpt2.inference.devices import kernels_run_on, weight_buffers
from max_gpt2.inference.lm_options import check_weight_format
from max_gpt2.inference.threads import AfterFirstRun
from max_gpt2.model.checkpoints.stored_weights import StoredWeights
from max_gpt2.model.layers.block import LinearFactory
from max_gpt2.model.layers.gpt2 import embedding_for, linear_for
from max_gpt2.model.layers.kernel_layers import SKINNY_ROWS, KernelLinear
from max_gpt2.model.layers.packed_linear import take_formats
from max_gpt2.model.layers.variants import LAST_LOGITS, LAST_LOGITS_DECODE, PLAIN, Variant
from max_gpt2.serving.drafts import CheckedDrafts
from max_gpt2.serving.drawn_from import DrawnOutputs, drawn_log_probabilities
from max_gpt2.serving.model_config import GPT2ServingConfig, opened_served
from max_gpt2.serving.paged_gpt2 import PagedGPT2LMHeadModel
from max_gpt2.serving.settings import ServingSettings
from max_gpt2.serving.vllm_logprobs import AskedInputs, asks, listed, ranks, with_ranks


@dataclass(frozen=True)
class ServedGraph:
    """One graph of a module compiled with others, as `execute` runs a compiled callable: its outputs'
    tree, and MAX's model."""

    out_tree: Any
    model: Model
    weights: dict[str, Buffer]  # the model reads these buffers: kept alive with it

    def execute_raw(self, *buffers: Buffer) -> list[Buffer]:
        """The graph's outputs for its input buffers, unchecked (MAX's batch processor made them)."""
        return self.model.execute(*buffers)


# Heap levels of the log-probability graph: 2**5 - 1 = 31 alternatives a token, room for vLLM's 20.
LOGPROB_LEVELS = 5


class GPT2PipelineModel(ModuleV3PipelineModelWithKVCache[TextContext]):
    """GPT-2 for MAX's text-generation pipeline, on MAX's paged KV cache, with log-probabilities.

    Its `load_model` replaces MAX's whole (several graphs, compiled together): it overrides and calls
    none of the private hooks MAX's `load_model` goes through (`max_gpt2.max_internals`).
    """

    model_config_cls: ClassVar[type[Any]] = GPT2ServingConfig
    batch_processor_cls: ClassVar[type[Llama3ModuleV3BatchProcessor]] = Llama3ModuleV3BatchProcessor

    def __init__(self, pipeline_config: Any, session: InferenceSession, *args: Any, **kwargs: Any) -> None:
        super().__init__(pipeline_config, session, *args, **kwargs)
        device = DeviceRef.from_device(self.devices[0])
        self._logprobs_model = session.load(log_probabilities_ragged_graph(device, levels=LOGPROB_LEVELS))

    def _checkpoint_weights(self) -> StoredWeights:
        """The checkpoint's parameters as bound in the served weight format (LoRA adapters merged), through
        the adapter `arch.py` registers for its files: a GGUF file given as MAX's weight path, else the
        model directory."""
        assert self.adapter is not None, "arch.py registers an adapter for safetensors and GGUF"
        return self.adapter(opened_served(self.pipeline_config.model), self.arch_config.weight_format)

    def _bound_buffers(self, state_dict: dict[str, Any], model_config: GPT2ServingConfig) -> dict[str, Any]:
        """The host buffers bound: the stored arrays as they are, the rest in the compute dtype
        (`max_gpt2.inference.devices.weight_buffers`)."""
        return weight_buffers(state_dict, model_config.weight_format, model_config.dtype)

    @traced
    def load_model(self) -> CompiledCallable | ServedGraph:
        """Compiles the general graph (returned: MAX keeps it as `self.model`) and the step-specific ones,
        on the host as one module (`max_gpt2.inference.compiled.compile_together`)."""
        state_dict = self._checkpoint_weights()
        config = self.arch_config_as(GPT2ServingConfig)  # what MAX built from `model_config_cls`
        check_weight_format(config.weight_format, self.devices[0], config.dtype)
        weights = self._bound_buffers(state_dict, config)
        kernels = kernels_run_on(self.devices[0], config.dtype)  # the CPU in float32
        self._after_first_run = AfterFirstRun(self.devices[0].is_host)  # `max_gpt2.inference.threads`
        linear = linear_for(config.weight_format, kernels)
        decoder_linear = linear if config.weight_format.kernels_only else KernelLinear
        echo = self.return_logits == ReturnLogits.ALL  # a server started with --enable-echo
        modules = {"general": self._module(config, linear, PLAIN if echo else LAST_LOGITS)}
        if kernels:
            modules["decoder"] = self._module(config, decoder_linear, LAST_LOGITS_DECODE)
        if echo:
            modules["last_token"] = self._module(config, linear, LAST_LOGITS)
        assert self.batch_processor is not None, "batch_processor_cls is MAX's Llama 3 batch processor"
        input_types = self.batch_processor.get_symbolic_inputs(
            kv_params=self.kv_params, device_refs=self.device_refs
        )
        if self.devices[0].is_host:
            graphs = self._compile_together(modules, input_types, weights)
        else:  # MAX's graph capture on an accelerator wants its own compiled callable
            graphs = {role: module.compile(*input_types, weights=weights) for role, module in modules.items()}
        self.decoder, self.last_token_model = graphs.get("decoder"), graphs.get("last_token")
        if self.decoder is None and (most := ServingSettings.from_environment().prompt_lookup):
            raise ValueError(
                f"prompt lookup ({most} tokens) checks drafts with the decoding kernels, which run on the "
                f"CPU in float32: not on {self.devices[0]} in {config.dtype}"
            )
        return graphs["general"]

    def _module(
        self, config: GPT2ServingConfig, linear: LinearFactory, variant: Variant
    ) -> PagedGPT2LMHeadModel:
        with F.lazy(), default_dtype(config.dtype):
            embedding = embedding_for(config.weight_format)
            module = PagedGPT2LMHeadModel(config.model, self.kv_params, variant, linear, embedding)
            take_formats(module, config.weight_format)  # a file's mix: each tensor in its own
            module.to(self.devices[0])
        return module

    def _compile_together(
        self, modules: dict[str, PagedGPT2LMHeadModel], input_types: Sequence[Any], weights: dict[str, Any]
    ) -> dict[str, ServedGraph]:
        """Each module's graph, compiled together: the kernels they share compile once."""
        staged = {role: module.trace(*input_types, name=f"gpt2_{role}") for role, module in modules.items()}
        session = InferenceSession(devices=self.devices)
        artifact = compile_together(session, [graph.graph for graph in staged.values()])
        models = session.init_all(artifact, weights_registry=weights)
        return {
            role: ServedGraph(graph.out_tree, models[graph.graph.name], weights)
            for role, graph in staged.items()
        }

    def prepare_initial_token_inputs(
        self,
        replica_batches: Sequence[Sequence[TextContext]],
        kv_cache_inputs: KVCacheInputs[Buffer, Buffer] | None = None,
        return_n_logits: int = 1,
    ) -> ModelInputs:
        """MAX's inputs, asking for every token's logits (`return_n_logits`: the most tokens a request
        brings) only in a step where some request wants log-probabilities: with echo they cover
        the prompt, and MAX's scorer takes one row of logits a token from a server that keeps them."""
        contexts = [context for batch in replica_batches for context in batch]
        if self.return_logits == ReturnLogits.ALL and any(context.log_probabilities for context in contexts):
            return_n_logits = max(context.tokens.active_length for context in contexts)
        inputs = super().prepare_initial_token_inputs(replica_batches, kv_cache_inputs, return_n_logits)
        assert isinstance(inputs, Llama3Inputs)  # MAX's batch processor's
        return AskedInputs.of(inputs, contexts)  # what vLLM's fields ask (`max_gpt2.serving.vllm_logprobs`)

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        """One step through the decoding graph when each request brings one token; else through the
        general one, or, when no request wants every token's logits, the last token's graph."""
        assert isinstance(model_inputs, Llama3Inputs)
        if isinstance(model_inputs, CheckedDrafts):  # S tokens a request: the logits after each
            assert self.decoder is not None, "load_model refuses prompt lookup without the decoding graph"
            logits = self._run(self.decoder, model_inputs).next_token_logits  # [R * S, V]
            return ModelOutputs(logits=logits, logit_offsets=model_inputs.input_row_offsets)
        tokens, requests = model_inputs.tokens.shape[0], model_inputs.input_row_offsets.shape[0] - 1
        if self.decoder is not None and tokens == requests <= SKINNY_ROWS:
            model = self.decoder
        elif self.last_token_model is not None and model_inputs.return_n_logits.to_numpy()[0] == 1:
            model = self.last_token_model  # the LM head over [R, D], not [T, D]
        else:
            model = self.model
        outputs = self._run(model, model_inputs)
        if outputs.logits is not None:
            return ModelOutputs(
                logits=outputs.logits,
                next_token_logits=outputs.next_token_logits,
                logit_offsets=outputs.logit_offsets,
            )
        # One row of logits a request, for MAX's sampler and scorer either way.
        one_row_each = Buffer.from_numpy(np.arange(requests + 1, dtype=np.uint32))
        return ModelOutputs(
            logits=outputs.next_token_logits,
            next_token_logits=outputs.next_token_logits,
            logit_offsets=one_row_each,
        )

    def _run(self, model: ServedGraph | CompiledCallable, model_inputs: Llama3Inputs) -> Any:
        """`model`'s outputs (`ModuleV3Outputs`) for MAX's inputs of a step."""
        if self.devices[0].is_host:
            # MAX 26.7 copies each step's cache lengths into the graph's input buffers with an
            # asynchronous copy, and on the CPU the graph may read them before it lands: a stale
            # length makes a request's token and cache wrong from then on (docs/performance.md).
            self.devices[0].synchronize()
        # MAX's batch processor made these buffers for this graph's inputs: the callable's own
        # call would check and wrap each again as a tensor, a cost every step (docs/performance.md).
        outputs = tree.unflatten(model.out_tree, model.execute_raw(*model_inputs.buffers))
        self._after_first_run.ran()
        return outputs

    def compute_log_probabilities(
        self,
        session: InferenceSession,
        model_inputs: Llama3Inputs,
        model_outputs: ModelOutputs,
        next_tokens: Buffer,
        batch_top_n: list[int],
        batch_echo: list[bool],
    ) -> list[LogProbabilities | None]:
        """Each request's log-probabilities (MAX's ragged graph, as `LogProbabilitiesMixin` computes them),
        with the first prompt token's (there is none: NaN) put in front, and where a request asks, each
        prompt token's rank and the ids it lists (`max_gpt2.serving.vllm_logprobs`); a request's that
        reports what its token was drawn from, of that (`max_gpt2.serving.drawn_from`).

        OpenAI's `echo` lists every prompt token, the first with no log-probability
        (null), and clients such as lm-evaluation-harness index the list by prompt
        position; MAX's starts at the second token. NaN goes out as JSON null.
        """
        assert model_outputs.next_token_logits is not None
        every_token = self.return_logits == ReturnLogits.ALL  # a server started with --enable-echo
        results = compute_log_probabilities_ragged(
            self.devices[0],
            self._logprobs_model,
            input_row_offsets=model_inputs.input_row_offsets.to_numpy(),
            logits=model_outputs.logits if every_token else None,
            next_token_logits=model_outputs.next_token_logits,
            tokens=model_inputs.tokens.to_numpy(),
            sampled_tokens=next_tokens.to_numpy(),
            batch_top_n=batch_top_n,
            batch_echo=batch_echo,
        )
        if isinstance(model_outputs, DrawnOutputs):  # `post_sampling_probs`: what each token is drawn from
            sampled = next_tokens.to_numpy()
            for row, among in model_outputs.drawn.items():
                results[row] = drawn_log_probabilities(among, int(sampled[row]), batch_top_n[row])
        tokens, offsets = model_inputs.tokens.to_numpy(), model_inputs.input_row_offsets.to_numpy()
        ranked, lists = asks(model_inputs)
        read = model_outputs.logits if every_token else model_outputs.next_token_logits  # as MAX's graph
        logits = read.to(CPU()).to_numpy() if ranked or lists else None  # [T or R, V]
        if any(batch_echo):
            (cache,) = tree.leaves(model_inputs.kv_cache_inputs, leaf=KVCacheInputsPerDevice)
            cached = cache.cache_lengths.to_numpy()  # [R]: tokens of each request before this step
            for row, result in enumerate(results):
                if batch_echo[row] and result is not None and cached[row] == 0:  # this step holds the prompt
                    results[row] = LogProbabilities(
                        token_log_probabilities=[math.nan, *result.token_log_probabilities],
                        top_log_probabilities=[{}, *result.top_log_probabilities],
                        sampled_token_ids=[int(tokens[offsets[row]]), *result.sampled_token_ids],
                    )
                    if logits is not None and row in ranked:
                        start, end = offsets[row], offsets[row + 1]
                        results[row] = with_ranks(results[row], ranks(logits[start:end], tokens[start:end]))
        for row, ids in lists.items():
            if (result := results[row]) is not None and logits is not None:
                results[row] = listed(result, logits[offsets[row + 1] - 1 if every_token else row], ids)
        return results
