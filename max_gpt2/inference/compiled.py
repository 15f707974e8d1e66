"""Compiled models: graph variants compiled on demand, and weights bound to them.

The attention and the language model each stage several graphs from the same
parameter names: the plain one, one that also outputs every head's attention
weights, and for the language model on the CPU one that runs decoding steps
through the Mojo kernels (`max_gpt2.model.layers.variants`). Compiling costs a minute
or two, so none is compiled before something asks for it, and the plain graph
never carries the extra output. A variant is any hashable value whose `str` names it.

    variants = GraphVariants(device, stage)      # stage(variant) -> Graph
    bound = BoundVariants(variants, weights)     # one set of weights, bound per variant on demand
    bound.execute(ATTENTIONS, ...)

Variants wanted together compile together (`GraphVariants.compile`): as one
module, the kernels they share are compiled once, and MAX's fixed cost of a
compile is paid once (docs/performance.md).

Every `BoundVariants` made from one `GraphVariants` shares its compiled graphs,
which is how `with_weights` swaps checkpoints without compiling again.
`CompiledModel` is what the attention (`CompiledAttention`) and the language
model (`CompiledLM`) have in common: a config, a device, a compute dtype, their
graph variants and one set of weights bound to them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
from max import engine
from max.driver import Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model

from max_gpt2.inference.artifacts import ArtifactCache
from max_gpt2.inference.devices import device_name, weight_buffers
from max_gpt2.inference.threads import AfterFirstRun
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32

if TYPE_CHECKING:
    from max.graph import Graph  # building graphs is the tracer's business: imported there
    from typing_extensions import Self


class GraphVariants:
    """The compiled graph variants of one model, device and dtype."""

    def __init__(
        self, device: Device, stage: Callable[[Any], Graph], artifacts: ArtifactCache | None = None
    ) -> None:
        """`stage(variant)` traces that variant's graph; it runs at most once per variant, and not at all
        where `artifacts` keeps the variants compiled by an earlier process (`max_gpt2.inference.artifacts`).

        Graphs staged for variants compiled together need distinct names, and so do their subgraphs.
        """
        self.device = device
        self.session = InferenceSession(devices=[device])
        self._stage = stage
        self._artifacts = artifacts
        self._compiled: dict[Hashable, tuple[engine.CompiledModel, str]] = {}  # variant -> (artifact, graph)
        self.announce: Callable[[str], AbstractContextManager[Any]] | None = None
        """Around each compile from now on, a step of progress (a load's `Progress.step`): a variant first
        needed after loading (scores, beam search's reorder) takes a minute or two to compile."""

    def compile(self, *variants: Hashable) -> None:
        """Compiles those of `variants` not compiled yet, together (`compile_together`), or reads them
        compiled from the artifact cache."""
        wanted = [variant for variant in dict.fromkeys(variants) if variant not in self._compiled]
        if not wanted:
            return
        keys = [str(variant) for variant in wanted]  # the artifact cache knows variants by name
        found = None if self._artifacts is None else self._artifacts.load(keys)
        if found is None:
            label = f"compiling the {' and '.join(keys)} graph (a minute or two; kept compiled after)"
            with nullcontext() if self.announce is None else self.announce(label):
                graphs = [self._stage(variant) for variant in wanted]
                artifact = compile_together(self.session, graphs)
            names = {key: graph.name for key, graph in zip(keys, graphs, strict=True)}
            if self._artifacts is not None:
                self._artifacts.save(keys, artifact, names)
        else:
            artifact, names = found
        for variant, key in zip(wanted, keys, strict=True):
            self._compiled[variant] = artifact, names[key]

    def kept(self, *variants: Hashable) -> bool:
        """Whether `variants` are compiled, or kept compiled by an earlier process: no compile ahead."""
        wanted = [str(variant) for variant in dict.fromkeys(variants) if variant not in self._compiled]
        return not wanted or (self._artifacts is not None and self._artifacts.holds(wanted))

    def compiled(self, variant: Hashable) -> engine.CompiledModel:
        """The artifact holding the variant, compiled now if it has not been yet."""
        self.compile(variant)
        return self._compiled[variant][0]

    def graph_names(self, artifact: engine.CompiledModel) -> dict[Hashable, str]:
        """The variants `artifact` holds, each with its graph's name (the key `init_all` gives it)."""
        return {variant: name for variant, (held_by, name) in self._compiled.items() if held_by is artifact}

    def compiled_variants(self) -> list[Hashable]:
        """The variants compiled so far."""
        return list(self._compiled)


def compile_together(session: InferenceSession, graphs: Sequence[Graph]) -> engine.CompiledModel:
    """One artifact holding `graphs` (`session.init_all` binds them all), several compiled as one
    module so that the kernels they share compile once. Their names must differ, their subgraphs' too.

    One graph goes through MAX's store of precompiled artifacts where the process installed one
    (`InferenceSession.default_mef_store`): a graph compiled on another machine, for a GPU it lacks,
    is then read instead of compiled (`benchmarks/gpu_proof.py --precompile`). Without one it compiles.
    """
    if len(graphs) == 1:
        return session.compile_reusing_mefs(graphs[0])
    module = graphs[0].module
    last = list(module.mlir_module.body)[-1]
    for graph in graphs[1:]:
        for op in list(graph.module.mlir_module.body):  # the graph and its subgraphs
            op.move_after(last)
            last = op
    libraries = dict.fromkeys(path for graph in graphs for path in graph.kernel_libraries_paths)
    return session.compile(module, custom_extensions=list(libraries))  # a module does not carry them


class BoundVariants:
    """One set of weights bound to the variants of a `GraphVariants`, each on first use."""

    def __init__(self, variants: GraphVariants, weights: Mapping[str, Buffer]) -> None:
        self.variants = variants
        self._weights = dict(weights)  # a bound model reads these buffers: keep them alive with it
        self._models: dict[Hashable, Model] = {}
        self._after_first_run = AfterFirstRun(variants.device.is_host)
        for variant in variants.compiled_variants():  # a bad registry fails here, not later
            self.model(variant)

    def model(self, variant: Hashable) -> Model:
        """The variant with these weights bound, compiling and binding it first if needed (and with
        it every variant compiled in the same artifact)."""
        if variant not in self._models:
            artifact = self.variants.compiled(variant)
            models = self.variants.session.init_all(artifact, weights_registry=self._weights)
            for held, name in self.variants.graph_names(artifact).items():
                # MAX's disk cache may hand back one graph compiled under another name from identical
                # ops: an artifact of one graph is that graph whatever its name.
                self._models[held] = models[name] if len(models) > 1 else next(iter(models.values()))
        return self._models[variant]

    def execute(self, variant: Hashable, *inputs: Buffer) -> list[Any]:
        """The variant's outputs for `inputs`. After the first run on the host, MAX's restless
        helper thread no longer preempts its workers (`max_gpt2.inference.threads`)."""
        outputs = self.model(variant).execute(*inputs)
        self._after_first_run.ran()
        return outputs


class CompiledModel(ABC):
    """A model compiled for one device and dtype, with one set of weights bound.

    Subclasses say how weights are checked (`check_weights`) and which fields
    their `repr` shows (`describe`); the rest is shared.
    """

    def __init__(
        self,
        config: GPT2Config,
        device: Device,
        dtype: DType,
        graph: GraphVariants,
        weights: Mapping[str, Any],
    ) -> None:
        """Binds `weights` (already checked by `check_weights`) to the compiled graphs.

        An array bound under several names (a tied LM head is `wte`'s array) is
        converted once and bound as one buffer.
        """
        self.config, self.device, self.dtype, self.graph = config, device, dtype, graph
        self._bound = BoundVariants(graph, self.buffers(weights))

    def buffers(self, weights: Mapping[str, Any]) -> dict[str, Buffer]:
        """The host buffers bound for `weights`: each array in the compute dtype, converted once
        (`devices.weight_buffers`)."""
        return weight_buffers(weights, FLOAT32, self.dtype)

    @staticmethod
    @abstractmethod
    def check_weights(weights: Mapping[str, Any], config: GPT2Config) -> Mapping[str, np.ndarray]:
        """`weights` checked against `config`; raises naming what does not fit."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The fields `repr` shows, `placement()` among them."""

    def placement(self) -> dict[str, str]:
        """Where and in what it computes, as `repr` shows it: `device` and `dtype`."""
        return {"device": device_name(self.device), "dtype": self.dtype.name}

    def with_weights(self, weights: Mapping[str, Any]) -> Self:
        """The same compiled graphs with other weights of the same shapes bound; no recompile."""
        checked = self.check_weights(weights, self.config)
        return type(self)(self.config, self.device, self.dtype, self.graph, checked)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.describe().items())
        return f"{type(self).__name__}({fields})"
