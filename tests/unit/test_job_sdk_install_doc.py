"""docs/job-sdk.md tells a training image to install the framework integrations next to gpumond-job, at the
versions the `lightning` and `hf` extras pin (pyproject.toml): those extras are gpumond's, and installing them
would bring the daemons into the image."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("extra", ["lightning", "hf"])
def test_the_sdk_guide_installs_a_framework_beside_gpumond_job_at_the_extras_pins(extra: str) -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    framework = [p for p in pins if not p.startswith("torch")]  # torch: the user's own build
    assert framework and all("==" in p for p in framework), pins
    guide = (ROOT / "docs" / "job-sdk.md").read_text()
    assert f"`pip install gpumond-job {' '.join(framework)}`" in guide
