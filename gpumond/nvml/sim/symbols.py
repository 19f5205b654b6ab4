"""What every simulated NVML symbol module shares: return codes, argument types, and the tables symbols
register in (by decorator, at import), which `library.build_library` turns into C function pointers.

A leaf: the modules that implement symbols (`library`, `gpm`, `nvlink`) import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from ctypes import POINTER, c_int, c_uint, c_ulonglong, c_void_p
from typing import Any

import pynvml as N

OK = N.NVML_SUCCESS
INVALID = N.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = N.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = N.NVML_ERROR_NO_PERMISSION
INSUFFICIENT_SIZE = N.NVML_ERROR_INSUFFICIENT_SIZE
NOT_FOUND = N.NVML_ERROR_NOT_FOUND
LOST = N.NVML_ERROR_GPU_IS_LOST
VERSION_MISMATCH = N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
UNKNOWN = N.NVML_ERROR_UNKNOWN

UINT_P = POINTER(c_uint)
ULL_P = POINTER(c_ulonglong)
INT_P = POINTER(c_int)
UINT, ULL = N.NVML_VALUE_TYPE_UNSIGNED_INT, N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG

# name -> (argument types after the device handle, implementation(sim, gpu, *args),
#          how many of them callers must pass, None = all)
DEVICE: dict[str, tuple[tuple[Any, ...], Callable[..., int], int | None]] = {}
# name -> (argument types, implementation(sim, *args), needs nvmlInit first)
SYSTEM: dict[str, tuple[tuple[Any, ...], Callable[..., int], bool]] = {}
# name -> implementation(sim, mig, *args) for a call on a MIG device handle (same argument types as
# DEVICE[name]). A device symbol without an entry here answers NOT_SUPPORTED on a MIG handle: what
# belongs to the whole board (temperature, power, clocks, utilization, ECC, limits) is the parent's.
MIG: dict[str, Callable[..., int]] = {}


def device(*argtypes: Any, names: tuple[str, ...] = (),
            required: int | None = None) -> Callable[[Callable[..., int]], Callable[..., int]]:
    def register(fn: Callable[..., int]) -> Callable[..., int]:
        for name in names or (fn.__name__,):
            DEVICE[name] = (argtypes, fn, required)
        return fn
    return register


def on_mig(*names: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    def register(fn: Callable[..., int]) -> Callable[..., int]:
        for name in names:
            MIG[name] = fn
        return fn
    return register


def system(*argtypes: Any, needs_init: bool = True, names: tuple[str, ...] = ()) -> Callable[..., Any]:
    def register(fn: Callable[..., int]) -> Callable[..., int]:
        for name in names or (fn.__name__,):
            SYSTEM[name] = (argtypes, fn, needs_init)
        return fn
    return register


def write_handle(out: int | None, handle: int) -> int:
    if not out:
        return INVALID
    c_void_p.from_address(out).value = handle
    return OK
