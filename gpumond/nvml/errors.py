"""The NVML error policy in one place: what each NVML return code means for the agent."""

from __future__ import annotations

import enum

import pynvml


class Disposition(enum.Enum):
    """What the caller should do after an NVML call failed."""

    UNSUPPORTED = "unsupported"  # stop asking this (GPU, field); never export 0/NaN for it
    MISSING_SYMBOL = "missing_symbol"  # older driver/binding: try the older symbol
    NO_PERMISSION = "no_permission"  # needs root / CAP_SYS_ADMIN; stop asking, say so once
    GPU_LOST = "gpu_lost"  # stop touching the handle; re-acquire with backoff
    DRIVER_MISMATCH = "driver_mismatch"  # driver upgraded without reboot: nothing will work until reboot
    NO_DRIVER = "no_driver"  # libnvidia-ml or the kernel module is absent
    NOT_INITIALISED = "not_initialised"  # library shut down under us: re-initialise
    TRANSIENT = "transient"  # Unknown, Timeout, NoData…: retry, count


_BY_CODE = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: Disposition.UNSUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: Disposition.MISSING_SYMBOL,
    # A versioned struct the driver does not know yet: same remedy as a missing symbol.
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: Disposition.MISSING_SYMBOL,
    pynvml.NVML_ERROR_NO_PERMISSION: Disposition.NO_PERMISSION,
    pynvml.NVML_ERROR_GPU_IS_LOST: Disposition.GPU_LOST,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: Disposition.DRIVER_MISMATCH,
    pynvml.NVML_ERROR_UNINITIALIZED: Disposition.NOT_INITIALISED,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: Disposition.NO_DRIVER,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: Disposition.NO_DRIVER,
}


def classify(err: pynvml.NVMLError) -> Disposition:
    """Map an NVMLError to the agent's disposition; anything unrecognised is transient."""
    return _BY_CODE.get(err.value, Disposition.TRANSIENT)


_NAMES = {
    getattr(pynvml, name): name[len("NVML_ERROR_"):].lower()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}


def error_name(err: pynvml.NVMLError) -> str:
    """A stable snake_case label for an NVML error (`gpu_is_lost`, `unknown`), for metrics."""
    return _NAMES.get(err.value, f"code_{err.value}")


HINTS = {
    Disposition.MISSING_SYMBOL: "the driver is older than nvidia-ml-py expects; using the older NVML call",
    Disposition.NO_PERMISSION: "run the agent with CAP_SYS_ADMIN (see deploy/systemd) to read this",
    Disposition.NO_DRIVER: (
        "no NVIDIA driver here (libnvidia-ml.so.1 or the kernel module is missing); "
        "to try gpumond without a GPU run: gpumond agent --sim 8"
    ),
    Disposition.DRIVER_MISMATCH: (
        "the NVIDIA kernel module and libnvidia-ml differ (driver upgraded without reboot): reboot the node"
    ),
}
