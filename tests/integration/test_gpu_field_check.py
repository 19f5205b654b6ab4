"""benchmarks/gpu_field_check.py, the GPU field check, run here against the simulator so it cannot rot between the
sessions lent a GPU: `--sim` runs the real agent (`gpumond agent --sim 3`), the simulated nvidia-smi, the load
process, the DDP job (ddp_job.py's host-side device time, 4 gloo ranks) and FSDP2 (2 ranks) on the CPU, and the
real rules service; the CUDA-only step (counting synchronising CUDA calls) is skipped and says so. Every wait in the script is bounded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_field_check.py"


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    out = tmp_path / "result.md"
    p = subprocess.run([sys.executable, str(SCRIPT), "--sim", "--pairs", "2", "--out", str(out), *args],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.exists(), p.stdout[-2000:] + p.stderr[-2000:]
    return p.returncode, out.read_text()


def test_the_whole_check_passes_on_the_simulator_and_writes_its_result(tmp_path: Path) -> None:
    code, text = run(tmp_path, "--quick", "--load-s", "2", "--evaluation", "1")
    assert code == 0, text
    assert text.startswith("# GPU field check (simulated)")
    for fact in ("**mode**: SIMULATED", "**driver**: ", "**CUDA (driver)**: ", "**torch**: ", "**verdict**: all"):
        assert fact in text
    for section in ("## 1. The agent against the driver", "## 2. GPM under the check's own loads",
                    "## 3. The job SDK and the whole path", "## 4. Nothing changed"):
        assert section in text
    assert "| GPU 2 power.draw.average | ok |" in text
    assert "| tiny kernel: busy but doing little | ok |" in text
    assert "| findings name rank 1 | ok | straggler on rank 1 firing" in text
    assert "| no host synchronisation added | — | skipped: no CUDA here (--sim) |" in text
    assert "| FSDP2: forward all-gather wait separates the slow rank | ok |" in text
    assert "| agent policy wrote nothing | ok |" in text


def test_without_nvidia_smi_it_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--nvidia-smi", str(tmp_path / "no-such-nvidia-smi")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gpu_field_check: nvidia-smi does not answer")
    assert "--sim" in p.stderr


def test_a_driver_that_disagrees_fails_the_check_naming_the_readings(tmp_path: Path) -> None:
    # nvidia-smi's node has GPU 2 idle while the agent's runs it flat out.
    scenario = tmp_path / "other.yaml"
    scenario.write_text((REPO / "benchmarks" / "field_check_sim.yaml").read_text().replace(
        "{index: 2, load: {pattern: constant, utilization: 1.0, intensity: 1.0}}", "{index: 2, load: {pattern: idle}}"))
    smi = f"{sys.executable} -m gpumond.nvml.sim.nvidia_smi --sim 3 --sim-scenario {scenario} --node-name field-node"
    code, text = run(tmp_path, "--phases", "driver", "--nvidia-smi", smi)
    assert code == 1
    assert "| GPU 2 utilization.gpu | **FAILED** | nvidia-smi 0 %, agent 100 %" in text
    assert "| GPU 2 power.draw.average | **FAILED** |" in text
    assert "| GPU 1 power.draw.average | ok |" in text
    assert "## 2. GPM" not in text  # --phases driver ran only that phase (and the settings check)
