"""The agent's sources (collectors), one module each, registered in `registry.py` with their enable rule.

As node_exporter registers each collector in its own file, each module here declares its source's name, tier,
when it is enabled and how it is built from the node's parts (`parts.py`); `registry.build` returns the
sources a node has, in the order they run, and the sampler runs them (`base.py`).
"""

from gpumond.agent.sources.base import (
    Cycle,
    PartialFailure,
    Source,
    Tiers,
    run_source,
    run_sources,
    self_series,
)

__all__ = ["Cycle", "PartialFailure", "Source", "Tiers", "run_source", "run_sources", "self_series"]
