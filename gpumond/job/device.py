"""This rank's GPU UUID from the local device, without importing torch or NVML ourselves."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from gpumond.wire.identity import DEVICE_UUID

NVIDIA_SMI_TIMEOUT_S = 5.0  # a wedged driver can hang nvidia-smi; a reporter must not

Runner = Callable[..., Any]  # subprocess.run's shape, injectable for tests


def local_rank(environ: Mapping[str, str]) -> int | None:
    """The rank's index on its node: LOCAL_RANK (torchrun) or SLURM_LOCALID (srun)."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        try:
            value = int(environ.get(name, ""))
        except ValueError:
            continue
        if value >= 0:
            return value
    return None


def device_selector(environ: Mapping[str, str]) -> str | None:
    """The physical device this rank uses, as `nvidia-smi -i` takes it; None when no GPU is visible."""
    index = local_rank(environ)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        # In a container the NVIDIA runtime names what it exposed, in CUDA's order: GPU-… UUIDs, or the
        # MIG-… UUID of a MIG slice (which torch and nvidia-smi would report as a plain GPU).
        exposed = [e.strip() for e in environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        if not exposed or not all(DEVICE_UUID.fullmatch(e) for e in exposed):
            return str(index or 0)
        visible = ",".join(exposed)
    entries = []
    for raw in visible.split(","):
        entry = raw.strip()
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry; "-1" or "" hides every GPU
        entries.append(entry)
    if not entries:
        return None
    # One entry per task (srun --gpus-per-task=1) means the rank's device is that entry,
    # whatever its local rank.
    return entries[index] if index is not None and index < len(entries) else entries[0]


def uuid_from_torch(environ: Mapping[str, str], modules: Mapping[str, ModuleType]) -> str | None:
    """The UUID torch reports for this rank's device, only if the user already initialised CUDA."""
    torch = modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        # Initialising CUDA on the user's behalf would break a fork-based DataLoader started later.
        if not cuda.is_initialized():
            return None
        index = local_rank(environ)
        if index is None or index >= cuda.device_count():
            index = cuda.current_device()
        raw = str(cuda.get_device_properties(index).uuid)
    except Exception:  # any torch build, any CUDA state: the answer is just "unknown"
        return None
    # torch prints the bare 8-4-4-4-12 form; NVML, the agent and the rules service use "GPU-…".
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


def uuid_from_nvidia_smi(selector: str, run: Runner = subprocess.run,
                         timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> str | None:
    """Ask nvidia-smi for one device's UUID; None on any failure."""
    try:
        done = run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", selector],
                   capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if done.returncode != 0:
        return None
    lines = [line.strip() for line in str(done.stdout).splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 and lines[0].startswith("GPU-") else None


def local_gpu_uuid(environ: Mapping[str, str], *, run: Runner = subprocess.run,
                   modules: Mapping[str, ModuleType] | None = None,
                   timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> str | None:
    """This rank's GPU UUID: a full UUID in CUDA_VISIBLE_DEVICES, else torch, else nvidia-smi."""
    selector = device_selector(environ)
    if selector is None:
        return None
    if DEVICE_UUID.fullmatch(selector):
        return selector
    # torch answers in-process for the device it really uses; nvidia-smi costs a subprocess.
    found = uuid_from_torch(environ, sys.modules if modules is None else modules)
    return found or uuid_from_nvidia_smi(selector, run, timeout_s)
