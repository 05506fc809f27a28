"""Keep freed memory in the participant for the next inference (glibc malloc).

By default glibc hands every freed block over 128 KiB back to the kernel (mmap
and munmap, or a trimmed heap) and adapts that threshold as it goes. An
inference allocates and frees the same activations every time, so a fresh
process pays for thousands of page faults per pass (the kernel zeroes every
page it hands out again), and how many depends on what the process did before.
That cost lands in whichever measurement happens to run, and on a CPU-quota'd
edge it eats the quota: on a quarter of a core, MobileNetV2's start-up passes
took 2,000-2,900 minor faults and 3-14 ms of system time each, and reached
layer 40 in 90-130 ms against 40-80 ms later in the same run.

A steady allocator (mmap only above 32 MiB, the most glibc allows; never trim)
keeps those pages, so every pass, profiled or measured, runs in the state a
long-running inference service reaches anyway. Elsewhere (musl, macOS) this is
a recorded no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit
TRIM_THRESHOLD = 2**31 - 1  # the largest a C int holds: in effect, never trim

#: what :func:`configure` did, for the participant's environment report
STATE: dict = {"allocator": "default"}


def configure(mode: str = "steady") -> dict:
    """Apply ``mode`` (``steady`` or ``default``) to this process's malloc; return :data:`STATE`."""
    global STATE
    if mode == "default":
        STATE = {"allocator": "default"}
        return STATE
    if mode != "steady":
        raise ValueError(f"unknown allocator mode {mode!r}: use 'steady' or 'default'")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        STATE = {"allocator": "default", "note": "no mallopt in this C library"}
        return STATE
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    STATE = ({"allocator": "steady", "mmap_threshold": MMAP_THRESHOLD_MAX,
              "trim_threshold": TRIM_THRESHOLD}
             if ok else {"allocator": "default", "note": "mallopt refused the settings"})
    return STATE
