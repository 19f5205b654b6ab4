"""Experiment, not shipped: the gpumond CLI served over uvicorn's httptools protocol without the connection
guard, to measure what the guard's h11 costs per scrape. Replacing `gpumond.serving.guarded_protocol` is
acceptable here only because this measures a configuration gpumond deliberately does not offer.

    python benchmarks/agent_serving.py --only gpumond,variant0 --name agent_serving_httptools \\
        --variant "httptools-unguarded=python benchmarks/_unguarded_agent.py"
"""

from __future__ import annotations

import sys

import gpumond.serving
from gpumond.cli import main


def _httptools(limits: object, stats: object = None, cap: object = None) -> tuple[str, object]:
    """uvicorn's own httptools protocol in place of the guarded h11 one (limits ignored: no guard)."""
    return "httptools", stats


if __name__ == "__main__":
    gpumond.serving.guarded_protocol = _httptools  # type: ignore[assignment]
    sys.exit(main())
