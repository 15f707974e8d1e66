"""A graph and its attention-weights variant, each compiled the first time it is needed.

The attention and the language model each stage to two graphs from the same
modules and parameter names: the plain one, and one that also outputs every
head's attention weights (`output_attentions=True`). Compiling costs a minute or
two, so neither is compiled before something asks for it, and the plain graph
never carries the extra output.

    variants = GraphVariants(device, stage)      # stage(output_attentions) -> Graph
    bound = BoundVariants(variants, weights)     # one set of weights, bound per variant on demand
    bound.model(output_attentions=True).execute(...)

Every `BoundVariants` made from one `GraphVariants` shares its compiled graphs,
which is how `with_weights` swaps checkpoints without compiling again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from max.driver import Buffer, Device
from max.engine import CompiledModel, InferenceSession, Model
from max.graph import Graph


class GraphVariants:
    """The compiled plain graph and attention-weights variant of one model, device and dtype."""

    def __init__(self, device: Device, stage: Callable[[bool], Graph]) -> None:
        """`stage(output_attentions)` traces the graph; it runs at most once per variant."""
        self.session = InferenceSession(devices=[device])
        self._stage = stage
        self._compiled: dict[bool, CompiledModel] = {}

    def compiled(self, output_attentions: bool = False) -> CompiledModel:
        """The variant, compiled now if it has not been yet."""
        if output_attentions not in self._compiled:
            self._compiled[output_attentions] = self.session.compile(self._stage(output_attentions))
        return self._compiled[output_attentions]

    def compiled_variants(self) -> list[bool]:
        """The `output_attentions` values compiled so far."""
        return list(self._compiled)


class BoundVariants:
    """One set of weights bound to the variants of a `GraphVariants`, each on first use."""

    def __init__(self, variants: GraphVariants, weights: Mapping[str, Buffer]) -> None:
        self.variants = variants
        self._weights = dict(weights)  # a bound model reads these buffers: keep them alive with it
        self._models: dict[bool, Model] = {}
        for output_attentions in variants.compiled_variants():  # a bad registry fails here, not later
            self.model(output_attentions)

    def model(self, output_attentions: bool = False) -> Model:
        """The variant with these weights bound, compiling and binding it first if needed."""
        if output_attentions not in self._models:
            compiled = self.variants.compiled(output_attentions)
            self._models[output_attentions] = self.variants.session.init(
                compiled, weights_registry=self._weights
            )
        return self._models[output_attentions]
