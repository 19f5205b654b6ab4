"""`import gpumond.job` must work in any training container: the standard library and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = {"pydantic", "prometheus_client", "psutil", "pynvml", "yaml", "apscheduler", "uvicorn", "torch",
         "numpy", "gpumond.config", "gpumond.agent", "gpumond.nvml", "gpumond.rules", "gpumond.alerts"}

# The product's shared small mechanisms the SDK uses; they too may import only the standard library.
SHARED = {"gpumond.retry", "gpumond.identity", "gpumond.safetext"}

PROBE = """
import json, sys
before = set(sys.modules)
import gpumond.job
gpumond.job.Reporter()  # constructing one (disabled here: no endpoint) must not import more
new = sorted(set(sys.modules) - before)
print(json.dumps(new))
bad = {heavy} & set(sys.modules)
assert not bad, bad
"""


def test_import_pulls_in_only_the_standard_library() -> None:
    code = PROBE.replace("{heavy}", repr(HEAVY))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2], env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    new = json.loads(done.stdout.splitlines()[-1])
    foreign = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names
               and m != "gpumond" and not m.startswith("gpumond.job") and m not in SHARED]
    assert foreign == []
    assert "gpumond.job.reporter" in new
