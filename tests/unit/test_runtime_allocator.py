"""The participant's steady allocator: freed activations stay in the process."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from experiment_design.runtime import allocator


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_steady_allocator_stops_per_pass_page_faults():
    # 16 passes that each hold 8 MiB and free it: glibc's default trims the freed heap back
    # to the kernel after every pass (then a page fault per 4 KiB touched); steady keeps it
    code = """
import resource, sys
from experiment_design.runtime.allocator import configure
state = configure(sys.argv[1]) if len(sys.argv) > 1 else None
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def churn():  # like an inference: eight 1 MiB activations live at once, then all freed
    for _ in range(16):
        blocks = [libc.malloc(1 << 20) for _ in range(8)]
        for p in blocks:
            ctypes.memset(p, 1, 1 << 20)
        for p in blocks:
            libc.free(p)
churn()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(state["allocator"] if state else "none", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
"""
    steady = _run(code.replace("sys.argv[1]", "'steady'").replace("len(sys.argv) > 1", "True"))
    default = _run(code.replace("sys.argv[1]", "'default'").replace("len(sys.argv) > 1", "True"))
    s_mode, s_faults = steady.split()
    d_mode, d_faults = default.split()
    assert (s_mode, d_mode) == ("steady", "default")
    assert int(d_faults) > 16 * 1000  # ~2,000 pages per pass handed back and faulted in again
    assert int(s_faults) < 200


def test_configure_modes_and_report():
    try:
        assert allocator.configure("default") == {"allocator": "default"}
        with pytest.raises(ValueError, match="unknown allocator mode"):
            allocator.configure("jemalloc")
        state = allocator.configure("steady")
        if platform.libc_ver()[0] == "glibc":
            assert state["allocator"] == "steady" and state["mmap_threshold"] == 32 << 20
        from experiment_design.runtime.environment import describe

        assert describe(threads=1)["allocator"] == state
    finally:
        allocator.configure("default")
