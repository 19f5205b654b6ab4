"""One build step pyproject.toml cannot say: the gpumond wheel leaves out gpumond/__init__.py.

The `gpumond` package is shared by two distributions built from this repository. gpumond-job (gpumond-job/) owns
its root, gpumond/__init__.py (the version) and py.typed, with the job SDK and the contract (gpumond/job,
gpumond/wire); this one adds the daemons' modules and subpackages beside them and depends on it. The root goes with
the SDK because a training image installs only that, and `import gpumond.job` must find a whole package there.
"""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """build_py without gpumond/__init__.py (the sdist keeps it: MANIFEST.in; the version is read from it)."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        return [m for m in super().find_package_modules(package, package_dir) if m[:2] != ("gpumond", "__init__")]


setup(cmdclass={"build_py": BuildPy})
