"""The Python release: scripts/check-release.sh passes for both distributions (build, twine check, sdist == wheel,
no file in both wheels, a bare venv imports gpumond.job from the gpumond-job wheel with no other package, a fresh
venv runs the gpumond wheel), the metadata is complete, and every place that names the version agrees with
gpumond/__init__.py.

The demo from the fresh venv (`DEMO_S=30 scripts/check-release.sh`) is left to the release: `gpumond demo` itself
is tested in test_demo.py, and the image test runs both daemons from an installed wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

import pytest
import yaml

from gpumond import __version__
from tests.integration.helpers import REPO_ROOT

pytestmark = pytest.mark.integration

CHECK_TIMEOUT_S = 600  # two isolated builds and a venv install: ~150 s on the 2-core test machine


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "check-release.sh")], cwd=REPO_ROOT,
                       env={**os.environ, "DIST": str(out), "DEMO_S": "0"}, capture_output=True, text=True,
                       timeout=CHECK_TIMEOUT_S)
    assert p.returncode == 0, f"scripts/check-release.sh exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for name in ("gpumond", "gpumond_job"):
        assert f"the {name} sdist builds the same wheel as the checkout" in p.stdout
    assert f"a bare venv imports gpumond.job {__version__} from the gpumond-job wheel, with no other package" in p.stdout
    assert f"a fresh venv runs gpumond {__version__} from the wheel" in p.stdout
    return out


def _metadata(wheel: Path, name: str = "gpumond") -> Message:
    with zipfile.ZipFile(wheel) as z:
        return HeaderParser().parsestr(z.read(f"{name}-{__version__}.dist-info/METADATA").decode())


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def test_the_wheel_metadata_is_complete(dist: Path) -> None:
    meta = _metadata(dist / f"gpumond-{__version__}-py3-none-any.whl")
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert meta["Requires-Python"] == ">=3.11"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Source", "Documentation", "Changelog", "Issues"} <= urls.keys(), urls
    assert all(u.startswith("https://") for u in urls.values())
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and "Typing :: Typed" in classifiers
    assert {"k8s", "torch"} <= set(meta.get_all("Provides-Extra"))
    assert meta["Description-Content-Type"] == "text/markdown"
    assert f"gpumond-job=={__version__}" in meta.get_all("Requires-Dist")
    with zipfile.ZipFile(dist / f"gpumond-{__version__}-py3-none-any.whl") as z:
        names = set(z.namelist())
    # Data the daemons read at run time ships in the wheel (a shipped scenario, the field catalogue, the proto).
    assert {"gpumond/nvml/sim/scenarios/demo.yaml", "gpumond/agent/podresources/v1/api.proto",
            f"gpumond-{__version__}.dist-info/licenses/LICENSE"} <= names


def test_the_job_wheel_is_the_sdk_and_the_contract_with_no_dependency(dist: Path) -> None:
    job_wheel, wheel = (dist / f"{n}-{__version__}-py3-none-any.whl" for n in ("gpumond_job", "gpumond"))
    meta = _metadata(job_wheel, "gpumond_job")
    assert meta["Name"] == "gpumond-job" and meta["Version"] == __version__
    assert meta.get_all("Requires-Dist") is None  # none at all, not even behind an extra
    assert meta["License-Expression"] == "Apache-2.0" and meta["Description-Content-Type"] == "text/markdown"
    job, daemons = _names(job_wheel), _names(wheel)
    # The package's root (the version, the typing marker) and gpumond/job, gpumond/wire: every module of them in
    # the tree, once, and nothing else; the daemons' wheel has the rest.
    tree = {p.relative_to(REPO_ROOT).as_posix() for sub in ("job", "wire")
            for p in (REPO_ROOT / "gpumond" / sub).glob("*.py")}
    assert job == tree | {"gpumond/__init__.py", "gpumond/py.typed"}
    assert not job & daemons
    assert "gpumond/cli/__init__.py" in daemons


def test_every_place_that_names_the_version_follows_gpumond_init() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]  # one source: gpumond/__init__.py
    assert f"gpumond-job=={__version__}" in project["dependencies"]  # the SDK of the same release
    job = tomllib.loads((REPO_ROOT / "gpumond-job" / "pyproject.toml").read_text())
    assert "version" in job["project"]["dynamic"]
    assert job["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpumond.__version__"}
    assert (REPO_ROOT / "gpumond-job" / "gpumond" / "__init__.py").resolve() == REPO_ROOT / "gpumond" / "__init__.py"
    chart = yaml.safe_load((REPO_ROOT / "deploy/helm/gpumond/Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(__version__)}\]", changelog, flags=re.MULTILINE), \
        f"CHANGELOG.md has no section for {__version__}"
    version = subprocess.run([sys.executable, "-m", "gpumond.cli", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    assert version == f"gpumond {__version__}"
