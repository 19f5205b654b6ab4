"""`import gpumond.job` must work in any training container: the standard library and nothing else.

Two checks: every import statement in gpumond/job/ and gpumond/wire/ (read by tests/import_graph.py, so a lazy
import inside a function counts too), and what a real `import gpumond.job` loads in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.import_graph import imported_names

PACKAGE = Path(__file__).resolve().parents[2] / "gpumond"

HEAVY = {"pydantic", "prometheus_client", "psutil", "pynvml", "yaml", "apscheduler", "uvicorn", "torch",
         "numpy", "gpumond.config", "gpumond.agent", "gpumond.nvml", "gpumond.rules", "gpumond.alerts"}

# The framework integrations import the framework the user trains with (each an optional extra), nothing more.
FRAMEWORKS = {"job/torch.py": {"torch"}, "job/loop.py": {"torch"}, "job/lightning.py": {"lightning"},
              "job/hf.py": {"transformers"}}
# What each package may import of gpumond: the contract imports only itself; the SDK itself and the contract, and
# `gpumond` for its version (gpumond/__init__.py ships in the gpumond-job distribution).
GPUMOND_ALLOWED = {"wire": ("gpumond.wire",), "job": ("gpumond.job", "gpumond.wire", "gpumond.__version__")}

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
               and m != "gpumond" and not m.startswith(("gpumond.job", "gpumond.wire"))]
    assert foreign == []
    assert "gpumond.job.reporter" in new


def foreign_imports(root: Path, sub: str) -> dict[str, list[str]]:
    """{file: imports that are neither the standard library, what GPUMOND_ALLOWED grants, nor its framework}."""
    bad: dict[str, list[str]] = {}
    for path in sorted((root / sub).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(("gpumond", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        foreign = sorted(m for m in imported_names(module, path)
                         if m.split(".")[0] not in sys.stdlib_module_names
                         and not any(m == a or m.startswith(a + ".") for a in GPUMOND_ALLOWED[sub])
                         and m.split(".")[0] not in FRAMEWORKS.get(rel, set()))
        if foreign:
            bad[rel] = foreign
    return bad


@pytest.mark.parametrize("sub", ["wire", "job"])
def test_the_contract_and_the_sdk_import_only_the_standard_library(sub: str) -> None:
    assert list((PACKAGE / sub).glob("*.py")), f"gpumond/{sub} has no modules"
    assert foreign_imports(PACKAGE, sub) == {}


def test_the_import_check_sees_a_third_party_import(tmp_path: Path) -> None:
    """The check itself: a lazy `import httpx` in the contract, or the SDK reaching into the daemons, is caught."""
    (tmp_path / "wire").mkdir()
    (tmp_path / "wire" / "x.py").write_text("import json\n\ndef f():\n    import httpx\n")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "y.py").write_text("from gpumond import __version__, rules\nfrom .z import q\n"
                                           "from ..wire import a\nimport numpy.linalg\n")
    assert foreign_imports(tmp_path, "wire") == {"wire/x.py": ["httpx"]}
    assert foreign_imports(tmp_path, "job") == {"job/y.py": ["gpumond.rules", "numpy.linalg"]}
