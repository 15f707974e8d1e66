"""The graph variants of one model, each compiled the first time it is needed.

The attention and the language model each stage several graphs from the same
parameter names: the plain one, one that also outputs every head's attention
weights (`"attentions"`), and for the language model on the CPU one that runs
decoding steps through the Mojo kernels (`"decode"`). Compiling costs a minute
or two, so none is compiled before something asks for it, and the plain graph
never carries the extra output.

    variants = GraphVariants(device, stage)      # stage(variant name) -> Graph
    bound = BoundVariants(variants, weights)     # one set of weights, bound per variant on demand
    bound.model("attentions").execute(...)

Every `BoundVariants` made from one `GraphVariants` shares its compiled graphs,
which is how `with_weights` swaps checkpoints without compiling again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from max.driver import Buffer, Device
from max.engine import CompiledModel, InferenceSession, Model
from max.graph import Graph


class GraphVariants:
    """The compiled graph variants of one model, device and dtype."""

    def __init__(self, device: Device, stage: Callable[[str], Graph]) -> None:
        """`stage(variant)` traces that variant's graph; it runs at most once per variant."""
        self.session = InferenceSession(devices=[device])
        self._stage = stage
        self._compiled: dict[str, CompiledModel] = {}

    def compiled(self, variant: str = "plain") -> CompiledModel:
        """The variant, compiled now if it has not been yet."""
        if variant not in self._compiled:
            self._compiled[variant] = self.session.compile(self._stage(variant))
        return self._compiled[variant]

    def compiled_variants(self) -> list[str]:
        """The variants compiled so far."""
        return list(self._compiled)


class BoundVariants:
    """One set of weights bound to the variants of a `GraphVariants`, each on first use."""

    def __init__(self, variants: GraphVariants, weights: Mapping[str, Buffer]) -> None:
        self.variants = variants
        self._weights = dict(weights)  # a bound model reads these buffers: keep them alive with it
        self._models: dict[str, Model] = {}
        for variant in variants.compiled_variants():  # a bad registry fails here, not later
            self.model(variant)

    def model(self, variant: str = "plain") -> Model:
        """The variant with these weights bound, compiling and binding it first if needed."""
        if variant not in self._models:
            compiled = self.variants.compiled(variant)
            self._models[variant] = self.variants.session.init(compiled, weights_registry=self._weights)
        return self._models[variant]
