"""The names that join gpumond's parts: GPU and MIG device UUIDs, job ids, and where a process's job id is.

The agent exports them, the job SDK pushes them and the rules service joins on them, so each is defined
here once. Stdlib only: the job SDK imports it inside training containers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpumond.wire.safetext import UNSAFE

HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
GPU_UUID = re.compile(rf"GPU-{HEX_UUID}")  # a whole GPU, as NVML names it
MIG_UUID = re.compile(rf"MIG-{HEX_UUID}")  # a MIG device (R470+ drivers)
# A MIG device's older name, MIG-GPU-<parent uuid>/<gpu instance>/<compute instance>: what
# CUDA_VISIBLE_DEVICES and nvidia-smi -L show on pre-R470 drivers.
LEGACY_MIG_UUID = re.compile(rf"MIG-GPU-({HEX_UUID})/(\d{{1,2}})/(\d{{1,2}})")
# Any of the three (spelt as the push API's published JSON Schema has always had it).
DEVICE_UUID = re.compile(rf"(?:GPU|MIG)-{HEX_UUID}|MIG-GPU-{HEX_UUID}/\d{{1,2}}/\d{{1,2}}")

# Where a process's job id is, first usable value first. GPUMOND_JOB_ID lets a user override the scheduler's.
JOB_ENV_VARS = ("GPUMOND_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
# torchrun's default --rdzv-id is the literal "none": it names no job.
_NOT_AN_ID = {"TORCHELASTIC_RUN_ID": "none"}
MAX_LABEL_CHARS = 128  # a job id (or any label taken from the environment) is cut to this


def canonical_device_uuid(value: str) -> str:
    """One spelling per device (lower-case hex; gpu / compute instance without leading zeros).

    `value` must match DEVICE_UUID.
    """
    legacy = LEGACY_MIG_UUID.fullmatch(value)
    if legacy:
        return legacy_mig_uuid(f"GPU-{legacy.group(1)}", int(legacy.group(2)), int(legacy.group(3)))
    return value[:4] + value[4:].lower()


def legacy_mig_uuid(parent_uuid: str, gpu_instance: int, compute_instance: int) -> str:
    """The pre-R470 name of a MIG device, `MIG-GPU-<parent uuid>/<gi>/<ci>`, in its canonical spelling."""
    return f"MIG-GPU-{parent_uuid[4:].lower()}/{gpu_instance}/{compute_instance}"


def clean_label(value: object) -> str | None:
    """A usable label (a job id, a node name) from a raw value: stripped, bounded; None when empty or unsafe.

    Unsafe means holding a character of gpumond.wire.safetext, which the push API refuses and no printer shows raw.
    """
    if value is None:
        return None
    text = str(value).strip()
    if not text or UNSAFE.search(text):
        return None
    return text[:MAX_LABEL_CHARS]


def first_env(environ: Mapping[str, str], names: Iterable[str]) -> tuple[str, str] | None:
    """(name, value) of the first variable in `names` holding a usable label (torchrun's "none" is not one)."""
    for name in names:
        value = clean_label(environ.get(name))
        if value is not None and value != _NOT_AN_ID.get(name):
            return name, value
    return None
