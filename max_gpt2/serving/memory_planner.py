"""How many requests MAX's scheduler may decode together: `GPT2MemoryPlanner`.

Left to itself MAX serves one request at a time on a CPU (its default for a single
host device), so every other client waits for a whole generation. A decoding step
reads every weight once whatever its batch, so requests decoded together share that
cost, and GPT-2 small still gains tokens/s up to a batch of 16 on a CPU
(docs/performance.md). `max-gpt2 serve --max-batch-size` overrides it; other devices
keep MAX's default.
"""

from __future__ import annotations

from typing import Any

from max.driver import Device
from max.pipelines.kv_cache.memory_planner import PagedMemoryPlanner

CPU_BATCH_SIZE = 16  # requests decoded together on a CPU


class GPT2MemoryPlanner(PagedMemoryPlanner):
    """MAX's paged-cache planner, with a batch of `CPU_BATCH_SIZE` requests on a CPU."""

    def infer_max_batch_size(
        self, pipeline_config: Any, devices: list[Device], weights_size: int
    ) -> int | None:
        return CPU_BATCH_SIZE if all(device.is_host for device in devices) else None


def planned_batch_size(pipeline_config: Any) -> int | None:
    """The requests decoded together as the API process can tell them (`/props`' `total_slots`): the
    batch asked for (`--max-batch-size`), else `CPU_BATCH_SIZE` on a CPU; None where MAX plans it."""
    if (asked := pipeline_config.runtime.max_batch_size) is not None:
        return asked
    on_host = all(spec.device_type == "cpu" for spec in pipeline_config.model.device_specs)
    return CPU_BATCH_SIZE if on_host else None
