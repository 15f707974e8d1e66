"""`MixedFormat`: a GGUF file's own mix of the kernels' formats (llama-quantize's presets, `gguf_mixes`),
each projection and the head in its own; `mixed` makes one where the decode-layer ops can take it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from max_gpt2.model.formats.format import TensorFormat, WeightFormat
from max_gpt2.model.parameters import LAYER_PRODUCT


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class MixedFormat(WeightFormat):
    """Each packed tensor in its own format (`format_for`: q4_k with q6_k, q4_0 beside a q6_k head), the
    modules built in `default` (its commonest) and then given theirs."""

    formats: tuple[tuple[str, TensorFormat], ...]  # by parameter name
    default: TensorFormat

    def format_for(self, name: str) -> TensorFormat:
        return dict(self.formats).get(name, self.default)

    def __eq__(self, other: object) -> bool:  # the same tensors in the same formats, opened twice
        return isinstance(other, MixedFormat) and other.formats == self.formats

    def __hash__(self) -> int:
        return hash(self.formats)

    @property
    def built_as(self) -> TensorFormat:
        return self.default


def mixed(formats: Mapping[str, TensorFormat]) -> MixedFormat | None:
    """The kernels' formats `formats` (the projections' and the head's, by parameter name) as one
    `MixedFormat`, or None where the decode-layer ops cannot take them: a float format (F32, F16), or
    a layer whose products are bound in different dtypes (bfloat16 beside blocks)."""
    if not all(format.kernels_only for format in formats.values()):
        return None
    layers: dict[str, dict[str, TensorFormat]] = {}  # a block's products' formats, by product
    for name, format in formats.items():
        if found := LAYER_PRODUCT.fullmatch(name):
            layers.setdefault(found[1], {})[found[2]] = format
    for products in layers.values():
        if len({format.weight_dtype for format in products.values()}) > 1:
            return None
    counts = Counter(formats.values())
    default = counts.most_common(1)[0][0]
    name = "+".join(format.name for format, _ in counts.most_common())
    bytes_per_weight = max(format.bytes_per_weight for format in counts)  # at most that
    return MixedFormat(
        name=name,
        bytes_per_weight=bytes_per_weight,
        ggml_type=default.ggml_type,
        file_type=default.file_type,
        kernels_only=True,
        quantized=True,
        formats=tuple(sorted(formats.items())),
        default=default,
    )
