"""Handing memory the process freed back to the kernel, for a server whose connections came and went in a burst.

glibc's malloc keeps what is freed inside its heaps for reuse and returns to the kernel only a free stretch at
a heap's top. A burst of connections (a flood of stalled TLS handshakes: OpenSSL's handshake state is ~45 KB
of small allocations each) interleaves its memory with longer-lived objects, so once they are all closed the
process stays as large as at the peak: 4,000 stalled handshakes left an agent at 1.25 GiB after every one was
closed. malloc_trim(0) hands back every free page wherever it lies in the heaps: with it the same flood (and a
bounded read buffer) went 288 MiB held -> 120 MiB after (benchmarks/results/tls_handshake_flood.md). Elsewhere
(musl, macOS) there is no such call and releasing is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def heap_releaser() -> Callable[[], None]:
    """A function that returns freed heap pages to the kernel (glibc's malloc_trim), or does nothing where the
    C library has no such call."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release
