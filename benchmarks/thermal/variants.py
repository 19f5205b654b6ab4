"""Controller variants for experiments: patch gpumond's thermal controller inside this process only.

`benchmarks/thermal_policy.py --variant NAME` runs run (c) with one of these in place of the shipped
logic, so that a proposed change can be measured on the same scenario before anyone edits gpumond/.
A variant replaces a private function of `gpumond.agent.policy.thermal` (thermal_step looks it up at
call time) and is undone on exit. Results of a variant run are printed, never written over the
committed results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from gpumond.agent.policy import thermal


# Empty now: the one variant measured here ("unbiased-power", the forecast on measured power clipped to
# the limit) was adopted into gpumond/agent/policy/thermal.py; add new experiments here.
VARIANTS: dict[str, tuple[str, Callable[..., object]]] = {}


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Patch the named variant in for the duration of the block (None: the shipped controller)."""
    if name is None:
        yield
        return
    attr, fn = VARIANTS[name]
    original = getattr(thermal, attr)
    setattr(thermal, attr, fn)
    try:
        yield
    finally:
        setattr(thermal, attr, original)
