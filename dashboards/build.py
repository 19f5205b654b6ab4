"""Build the dashboards: `python -m dashboards.build` writes dashboards/provisioning/dashboards/gpumond/*.json
and the Helm chart's copy in deploy/helm/gpumond/files/dashboards/; `--check` fails when either drifts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder

from dashboards import fleet, job, node
from dashboards.model import dashboard

# Inside the provisioning tree, so `cp -r dashboards/provisioning/. /etc/grafana/provisioning/` installs everything.
OUT = Path(__file__).resolve().parent / "provisioning" / "dashboards" / "gpumond"
# The chart's ConfigMaps read them with .Files.Get, which cannot reach outside the chart (and a symlink would
# not survive `helm package`), so the chart carries a copy, written and checked here with the originals.
CHART_OUT = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "gpumond" / "files" / "dashboards"
BUILDERS = {"fleet": fleet.build, "node": node.build, "job": job.build}


def render(name: str) -> dict[str, Any]:
    """One dashboard as Grafana's current JSON model."""
    raw = json.loads(json.dumps(BUILDERS[name]().to_json_data(), cls=DashboardEncoder))
    return dashboard(raw)


def text(name: str) -> str:
    """The committed file's exact text."""
    return json.dumps(render(name), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a committed JSON (or the Helm chart's copy) differs from its source")
    args = ap.parse_args(argv)
    stale = []
    for name in BUILDERS:
        new = text(name)
        for out in (OUT, CHART_OUT):
            path = out / f"gpumond-{name}.json"
            if args.check:
                if not path.exists() or path.read_text(encoding="utf-8") != new:
                    stale.append(str(path))
            else:
                out.mkdir(parents=True, exist_ok=True)
                path.write_text(new, encoding="utf-8")
                print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}: run `python -m dashboards.build` and commit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
