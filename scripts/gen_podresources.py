"""Regenerate the kubelet pod-resources client from its api.proto (needs the pinned grpcio-tools).

    python scripts/gen_podresources.py            # rewrite gpumond/agent/podresources/v1/api_pb2*.py
    python scripts/gen_podresources.py --out DIR  # write them under DIR instead (the in-step test does this)

The generated modules are committed so that installing gpumond[k8s] needs no compiler; the test
tests/unit/test_podresources_generated.py fails when they drift from api.proto or from grpcio-tools.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "gpumond/agent/podresources/v1/api.proto"  # relative to ROOT: fixes the generated import paths


def generate(out: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on api.proto; returns the files written under `out`."""
    from grpc_tools import protoc  # the pinned test/dev dependency, imported only here

    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out}",
                        f"--grpc_python_out={out}", str(ROOT / PROTO)])
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code} on {PROTO}")
    base = out / Path(PROTO).parent
    return [base / "api_pb2.py", base / "api_pb2_grpc.py"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write under (default: the repository)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
