"""Experiments, not shipped: the gpumond CLI served over another HTTP protocol than the daemons choose, to
measure what the connection guard and the parser cost per scrape. Replacing a name in `gpumond.web.serving` is
acceptable here only because this measures configurations gpumond does not offer (unguarded), or takes only
where httptools cannot be imported (guarded h11).

    python benchmarks/agent_serving.py --only gpumond,variant0,variant1 --name agent_serving \\
        --variant "httptools, no connection guard (not shipped)=python benchmarks/_agent_variant.py unguarded" \\
        --variant "guarded h11 (without httptools)=python benchmarks/_agent_variant.py h11"

The first argument names the variant; the rest is the gpumond command line.
"""

from __future__ import annotations

import sys

import gpumond.web.serving
from gpumond.cli import main


def _unguarded(limits: object, stats: object = None, cap: object = None, **_: object) -> tuple[str, object]:
    """uvicorn's own httptools protocol in place of the guarded one (limits ignored: no guard)."""
    return "httptools", stats


VARIANTS = {
    "unguarded": lambda: setattr(gpumond.web.serving, "guarded_protocol", _unguarded),
    "h11": lambda: setattr(gpumond.web.serving, "default_parser", lambda: "h11"),
}

if __name__ == "__main__":
    variant = sys.argv.pop(1)
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    VARIANTS[variant]()
    sys.exit(main())
